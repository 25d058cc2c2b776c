"""OpenMP threads spin briefly, then sleep (stalegrad/__init__.py): set before torch loads, the user's
choice kept, and the arithmetic unchanged (docs/performance.md, "Stalls")."""
import os
import subprocess
import sys

RUN = ("import stalegrad as sg, torch, os; torch.set_num_threads(2); "
       "tr, te = sg.load_pair('digits'); "
       "r = sg.train('mlp', tr, te, 'dcasgd-c', workers=2, epochs=0.5, lr=0.1, seed=0); "
       "print(os.environ.get('OMP_WAIT_POLICY'), os.environ.get('GOMP_SPINCOUNT'), r.summary['weights_sha256'])")


def python(code: str, **env) -> str:
    environ = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    environ.update(env)
    return subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True,
                          check=True, timeout=600).stdout.split()   # generous: a starved machine, not a hang


def test_a_short_spin_by_default_and_the_users_choice_wins():
    show = "import stalegrad, os; print(os.environ.get('OMP_WAIT_POLICY'), os.environ.get('GOMP_SPINCOUNT'))"
    assert python(show) == ["None", "10000"]
    assert python(show, OMP_WAIT_POLICY="ACTIVE") == ["ACTIVE", "None"]
    assert python(show, GOMP_SPINCOUNT="5") == ["None", "5"]


def test_wait_policy_does_not_change_results():
    short = python(RUN)
    active = python(RUN, OMP_WAIT_POLICY="ACTIVE")
    passive = python(RUN, OMP_WAIT_POLICY="PASSIVE")
    assert short[:2] == ["None", "10000"] and active[0] == "ACTIVE" and passive[0] == "PASSIVE"
    assert short[2] == active[2] == passive[2]
