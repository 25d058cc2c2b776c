"""End to end against an independent reference.

A few lines of float64 numpy replay the papers' protocol (DC-ASGD's
Algorithms 1 and 2; AGN's worker loop) for multinomial logistic regression,
whose gradient is written out by hand: X^T (softmax(XW^T + b) - onehot) / B.
The library's simulator, with its model, flat vectors, parameter server and
event queue, must land on the same weights.
"""
import numpy as np
import pytest
import torch

import stalegrad as sg
from stalegrad.runtimes import Simulator
from stalegrad.worker import BatchStream

from helpers import TEST, TRAIN

X = TRAIN.x.double().numpy()
Y = TRAIN.y.numpy()
C, D = 3, X.shape[1]


def grad(w, idx):
    W, b = w[:C * D].reshape(C, D), w[C * D:]
    x, y = X[idx], Y[idx]
    z = x @ W.T + b
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(len(y)), y] -= 1
    p /= len(y)
    return np.concatenate([(p.T @ x).ravel(), p.sum(0)])


def library_run(algorithm, M, epochs=2, B=8, lr=0.1, seed=3):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(D, C))
    w0 = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).double().numpy()
    res = sg.train(model, TRAIN, TEST, algorithm, M, Simulator(delay="uniform"), epochs=epochs, batch_size=B,
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
