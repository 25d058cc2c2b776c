"""End to end against an independent reference.

A few lines of float64 numpy replay the papers' protocol (DC-ASGD's
Algorithms 1 and 2; AGN's worker loop; the equations of the rules after 2017:
staleness-aware ASGD, Gap-Aware, DANA, DiLoCo's outer Nesterov, asynchronous
Local-SGD's delayed Nesterov) for multinomial logistic regression,
whose gradient is written out by hand: X^T (softmax(XW^T + b) - onehot) / B.
The library's simulator, with its model, flat vectors, parameter server and
event queue, must land on the same weights.
"""
import numpy as np
import pytest
import torch

import stalegrad as sg
from stalegrad.runtimes import Simulator
from stalegrad.core.worker import BatchStream

from helpers import TEST, TRAIN, logreg_grad

X = TRAIN.x.double().numpy()
Y = TRAIN.y.numpy()
C, D = 3, X.shape[1]


grad = logreg_grad(X, Y, C)


def library_run(algorithm, M, epochs=2, B=8, lr=0.1, seed=3):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(D, C))
    w0 = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).double().numpy()
    res = sg.train(model, TRAIN, TEST, algorithm, M, Simulator(delay="round-robin"), epochs=epochs, batch_size=B,
                   lr=lr, seed=seed)
    streams = [BatchStream(len(Y), m, M, B, "shard", seed) for m in range(M)]
    return res, w0, streams


@pytest.mark.parametrize("name,M", [("asgd", 4), ("dcasgd-c", 4), ("dcasgd-a", 4), ("dcasgd-a", 7)])
def test_round_robin_gradient_rules_match_the_reference(name, M):
    lam, lam0, mom, eps, lr = 0.04, 2.0, 0.95, 1e-7, 0.1
    res, w, streams = library_run(sg.make_algorithm(name), M, lr=lr)
    bak = [w.copy() for _ in range(M)]          # every worker pulled w0
    ms = [np.zeros_like(w) for _ in range(M)]
    for k in range(res.summary["updates"]):
        m = k % M                                # round robin: staleness M-1 once warm
        g = grad(bak[m], streams[m].next().numpy())
        if name == "asgd":
            w = w - lr * g
        elif name == "dcasgd-c":
            w = w - lr * (g + lam * g * g * (w - bak[m]))
        else:
            ms[m] = mom * ms[m] + (1 - mom) * g * g
            w = w - lr * (g + lam0 / np.sqrt(ms[m] + eps) * g * g * (w - bak[m]))
        bak[m] = w.copy()                        # the worker pulls right after its push
    np.testing.assert_allclose(res.weights.double().numpy(), w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["agn", "downpour", "dynsgd"])
def test_round_robin_commit_rules_match_the_reference(name):
    M, window, lr = 3, 4, 0.05
    res, w, streams = library_run(sg.make_algorithm(name, window=window, local_opt="sgd"), M, lr=lr)
    pulled = [w.copy() for _ in range(M)]
    pulled_at = [0] * M
    for k in range(res.summary["updates"]):
        m = k % M
        local = pulled[m].copy()
        for _ in range(window):
            local -= lr * grad(local, streams[m].next().numpy())
        delta = local - pulled[m]
        if name == "agn":
            delta /= window
        if name == "dynsgd":
            delta /= (k - pulled_at[m]) + 1
        w = w + delta
        pulled[m], pulled_at[m] = w.copy(), k + 1
    np.testing.assert_allclose(res.weights.double().numpy(), w, rtol=1e-4, atol=1e-5)



def test_round_robin_aeasgd_matches_dist_keras_worker_loop():
    """dist-keras' AEASGDWorker.optimize (the thesis's Algorithm algo:aeasgd_worker): the worker keeps its own
    weights and its local optimizer's state across exchanges (Keras' set_weights leaves the optimizer alone);
    after its window it pulls the centre *then*, E = rho*learning_rate*(x - c), x <- x - E, commit E, and the
    server adds E. The local optimizer here is Adam in torch's form (dist-keras ran Keras' Adam, whose epsilon
    sits outside the bias correction: a difference of order 1e-8 in the denominator, not reproduced)."""
    M, window, lr, rho, elastic_lr = 3, 4, 0.01, 5.0, 0.01
    b1, b2, eps = 0.9, 0.999, 1e-8
    alpha = rho * elastic_lr
    res, c, streams = library_run(sg.make_algorithm("aeasgd", window=window, local_opt="adam", rho=rho,
                                                    elastic_lr=elastic_lr), M, lr=lr)
    x = [c.copy() for _ in range(M)]                 # every worker starts from the centre
    mom = [np.zeros_like(c) for _ in range(M)]
    var = [np.zeros_like(c) for _ in range(M)]
    steps = [0] * M
    for k in range(res.summary["updates"]):
        m = k % M
        for _ in range(window):                      # the local optimizer, never reset
            g = grad(x[m], streams[m].next().numpy())
            steps[m] += 1
            mom[m] = b1 * mom[m] + (1 - b1) * g
            var[m] = b2 * var[m] + (1 - b2) * g * g
            denom = np.sqrt(var[m] / (1 - b2 ** steps[m])) + eps
            x[m] = x[m] - lr / (1 - b1 ** steps[m]) * mom[m] / denom
        e = alpha * (x[m] - c)                       # the centre as pulled after the window
        x[m] = x[m] - e
        c = c + e
    assert res.summary["updates"] >= 2 * M
    np.testing.assert_allclose(res.weights.double().numpy(), c, rtol=1e-4, atol=1e-5)


# ---- the rules after 2017, each from its paper's equations ---------------------------------------
def test_round_robin_staleness_and_gap_rules_match_the_reference():
    M, lr, beta, eps = 4, 0.1, 0.999, 1e-8
    for name in ("sasgd", "gap-aware"):
        res, w, streams = library_run(sg.make_algorithm(name), M, lr=lr)
        bak = [w.copy() for _ in range(M)]
        pulled_at = [0] * M
        sq, lr_max = np.zeros_like(w), 0.0
        for k in range(res.summary["updates"]):
            m = k % M
            g = grad(bak[m], streams[m].next().numpy())
            if name == "sasgd":                  # Zhang et al.: tau = i - j, alpha0/tau (alpha0 at tau = 0)
                tau = k - pulled_at[m]
                w = w - (lr / tau if tau >= 1 else lr) * g
            else:                                # Barkai et al., as their group's GapAware computes it: the
                lr_max = max(lr_max, lr)         # average of g^2 first, k+1 in the bias, then g / Gap
                sq = beta * sq + (1 - beta) * g * g
                gap = 1 + np.abs(w - bak[m]) / (lr_max * (np.sqrt(sq / (1 - beta ** (k + 1))) + eps))
                w = w - lr * g / gap
            bak[m], pulled_at[m] = w.copy(), k + 1
        np.testing.assert_allclose(res.weights.double().numpy(), w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["dana-zero", "dana-dc"])
def test_round_robin_dana_matches_the_reference(name):
    # Hakimi et al.: the server keeps one momentum per worker; a worker computes its gradient at the
    # look-ahead w - lr*gamma*sum(v) that the server sent it (DANA-DC: and the server compensates it)
    M, lr, gamma, lam = 4, 0.02, 0.9, 2.0
    res, w, streams = library_run(sg.make_algorithm(name), M, lr=lr)
    v = [np.zeros_like(w) for _ in range(M)]
    look = [w.copy() for _ in range(M)]          # nothing moved yet: every look-ahead is w0
    for k in range(res.summary["updates"]):
        m = k % M
        g = grad(look[m], streams[m].next().numpy())
        if name == "dana-dc":
            g = g + lam * g * g * (w - look[m])
        v[m] = gamma * v[m] + g
        w = w - lr * v[m]
        look[m] = w - lr * gamma * sum(v)
    np.testing.assert_allclose(res.weights.double().numpy(), w, rtol=1e-4, atol=1e-5)


def local_steps(w, stream, window, lr):
    for _ in range(window):
        w = w - lr * grad(w, stream.next().numpy())
    return w


@pytest.mark.parametrize("name,params", [
    ("agn", {"outer_opt": "nesterov", "outer_lr": 0.7}),
    ("dynsgd", {"outer_opt": "nesterov", "outer_lr": 0.5, "outer_momentum": 0.8}),
    ("async-local-sgd", {"outer_opt": "nesterov"}),
    ("async-local-sgd", {}),                                  # delayed nesterov, N = M
    ("async-local-sgd", {"dn_delay": 2, "dn_c": 0.25}),
])
def test_round_robin_outer_optimizers_match_the_reference(name, params):
    M, window, lr = 3, 4, 0.05
    algo = sg.make_algorithm(name, window=window, local_opt="sgd", **params)
    res, w, streams = library_run(algo, M, lr=lr)
    eps, mu = algo.outer_lr, algo.outer_momentum
    N, c = algo.dn_delay or M if name == "async-local-sgd" else 0, getattr(algo, "dn_c", 0.0)
    buf, D = np.zeros_like(w), np.zeros_like(w)
    pulled = [w.copy() for _ in range(M)]
    pulled_at = [0] * M
    for t in range(res.summary["updates"]):
        m = t % M
        p = pulled[m] - local_steps(pulled[m], streams[m], window, lr)   # DiLoCo's pseudo-gradient
        if name == "agn":
            p = p / window
        if name == "dynsgd":
            p = p / ((t - pulled_at[m]) + 1)
        if algo.outer_opt == "nesterov":         # torch.optim.SGD(nesterov=True) on p
            buf = mu * buf + p
            w = w - eps * (p + mu * buf)
        else:                                    # Liu et al., Algorithm 3 (delayed Nesterov)
            D = D + p
            if (t + 1) % N == 0:
                buf = mu * buf + D / N
                w = w - eps * ((1 - c * N + c) * mu * buf + p / N)
                D = np.zeros_like(w)
            else:
                w = w - eps * (c * mu * buf + p / N)
        pulled[m], pulled_at[m] = w.copy(), t + 1
    np.testing.assert_allclose(res.weights.double().numpy(), w, rtol=1e-4, atol=1e-5)


def test_diloco_rounds_match_the_reference():
    M, window, lr, eps, mu = 3, 4, 0.05, 0.7, 0.9
    res, w, streams = library_run(sg.make_algorithm("diloco", window=window, local_opt="sgd"), M, lr=lr)
    buf = np.zeros_like(w)
    for _ in range(res.summary["updates"]):      # one outer step per round of all M workers
        p = sum(w - local_steps(w, streams[m], window, lr) for m in range(M)) / M
        buf = mu * buf + p
        w = w - eps * (p + mu * buf)
    np.testing.assert_allclose(res.weights.double().numpy(), w, rtol=1e-4, atol=1e-5)


def test_agn_with_outer_sgd_at_rate_one_is_todays_agn():
    from dataclasses import dataclass

    from stalegrad.algorithms import CommitAlgorithm

    @dataclass(frozen=True)
    class TodaysAGN(CommitAlgorithm):            # agn before the outer optimizer: the server adds the commit
        name = "agn"
        normalise = True

    runs = [library_run(algo, 3, lr=0.01)[0] for algo in
            (TodaysAGN(), sg.make_algorithm("agn"), sg.make_algorithm("agn", outer_opt="sgd", outer_lr=1.0))]
    assert runs[0].summary["updates"] > 0
    assert len({r.summary["weights_sha256"] for r in runs}) == 1
    nesterov = library_run(sg.make_algorithm("agn", outer_opt="nesterov"), 3, lr=0.01)[0]
    assert nesterov.summary["weights_sha256"] != runs[0].summary["weights_sha256"]
