"""OpenMP threads wait passively (stalegrad/__init__.py): set before torch loads, the user's
choice kept, and the arithmetic unchanged (docs/performance.md, "Stalls")."""
import os
import subprocess
import sys

RUN = ("import stalegrad as sg, torch, os; torch.set_num_threads(2); "
       "tr, te = sg.load_pair('digits'); "
       "r = sg.train('mlp', tr, te, 'dcasgd-c', workers=2, epochs=0.5, lr=0.1, seed=0); "
       "print(os.environ['OMP_WAIT_POLICY'], r.summary['weights_sha256'])")


def python(code: str, **env) -> str:
    environ = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    environ.update(env)
    return subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True,
                          check=True, timeout=600).stdout.split()   # generous: a starved machine, not a hang


def test_passive_by_default_and_the_users_choice_wins():
    assert python("import stalegrad, os; print(os.environ['OMP_WAIT_POLICY'])") == ["PASSIVE"]
    assert python("import stalegrad, os; print(os.environ['OMP_WAIT_POLICY'])",
                  OMP_WAIT_POLICY="ACTIVE") == ["ACTIVE"]


def test_wait_policy_does_not_change_results():
    passive = python(RUN)
    active = python(RUN, OMP_WAIT_POLICY="ACTIVE")
    assert passive[0] == "PASSIVE" and active[0] == "ACTIVE"
    assert passive[1] == active[1]
