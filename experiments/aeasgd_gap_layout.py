"""The thesis's data layout, emulated: data/mnist_train.parquet as written by dist-keras's
examples/mnist_preprocessing.ipynb (the training set and 10 copies of it, unionAll: 660,000 rows), dealt into
n partitions. Each 'epoch' is one pass over the 11 copies, so E epochs = 11*E MNIST epochs.
usage: python experiments/aeasgd_gap_layout.py ALGO EPOCHS_OVER_11X OUT.json [DATA_DIR]
(docs/results/aeasgd_gap.md; n = 40, window 40, the small mlp, round-robin, seed 1)"""
import argparse
import json
import time

import torch

import stalegrad as sg
from stalegrad.models import build_model


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("algo", help="agn or aeasgd")
    ap.add_argument("epochs", type=float, help="passes over the 11 copies")
    ap.add_argument("out", help="the JSON file to write")
    ap.add_argument("data_dir", nargs="?", default=None, help="where MNIST is")
    args = ap.parse_args(argv)
    algo_name, epochs, out = args.algo, args.epochs, args.out
    train, test = sg.load_pair("mnist", args.data_dir)
    big = sg.Dataset("mnist", train.x.repeat(11, 1, 1, 1), train.y.repeat(11), train.num_classes)
    params = dict(window=40)
    if algo_name == "aeasgd":
        params.update(rho=5.0, elastic_lr=0.01)
    algo = sg.make_algorithm(algo_name, **params)
    torch.manual_seed(1)
    module = build_model("mlp", tuple(train.x.shape[1:]), train.num_classes)
    t0 = time.process_time()
    res = sg.train(module, big, test, algo, 40, sg.Simulator(delay="round-robin", vectorised=True, threads=1),
                   epochs=epochs, batch_size=128, lr=0.001, seed=1, init="glorot-uniform", eval_every=4 / 11)
    curve = [(round(r["epoch"] * 11, 2), r["updates"], r["test_acc"]) for r in res.metrics]
    with open(out, "w") as f:
        json.dump({"algo": algo_name, "epochs_over_11x": epochs, "cpu_s": time.process_time() - t0,
                   "curve_mnist_epochs_updates_acc": curve, "summary": res.summary}, f, indent=1)
    print(algo_name, epochs, curve[-1])


if __name__ == "__main__":
    main()
