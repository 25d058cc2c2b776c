"""The thesis's data layout, ``--partition replicate:K`` (issue 31): K copies of the training set, one
permutation of their rows dealt into a slice per worker, as dist-keras' 11-fold MNIST file and Spark's
``repartition(n)`` gave the thesis's workers. The expected share of distinct samples per worker is the
independent formula 1 - (1 - 1/n)^K (each of a sample's K copies lands on a given worker with chance 1/n)."""
import math
from collections import Counter

import pytest

import stalegrad as sg
from stalegrad.cli import main
from stalegrad.run.config import MAX_COPIES, parse_partition
from stalegrad.errors import ConfigError
from stalegrad.core.worker import BatchStream

from helpers import blobs


def pools(n, M, K, seed=0, batch=8):
    return [BatchStream(n, m, M, batch, f"replicate:{K}", seed=seed).pool.tolist() for m in range(M)]


def test_each_sample_is_dealt_exactly_k_times_and_the_slices_are_equal():
    n, M, K = 1000, 7, 11
    ps = pools(n, M, K)
    counts = Counter(i for p in ps for i in p)
    assert set(counts) == set(range(n)) and set(counts.values()) == {K}   # K copies of every sample, no more
    sizes = sorted(len(p) for p in ps)
    assert sum(sizes) == K * n and sizes[-1] - sizes[0] <= 1            # K*N/n rows each (tensor_split)


def test_share_of_distinct_samples_per_worker_is_the_thesis_figure():
    n_samples, M, K = 6000, 40, 11                  # MNIST's 60,000 scaled by 1/10: the share does not depend on N
    expected = 1 - (1 - 1 / M) ** K                 # 0.2432: the thesis's "about 24%"
    shares = [len(set(p)) / n_samples for p in pools(n_samples, M, K, seed=3)]
    mean = sum(shares) / M
    assert abs(expected - 0.2432) < 1e-3
    assert abs(mean - expected) < 0.005, (mean, expected)
    assert all(abs(s - expected) < 0.03 for s in shares)
    assert all(len(p) == K * n_samples // M for p in pools(n_samples, M, K, seed=3))   # 1650 rows, about 24% distinct


def test_the_layout_is_fixed_by_the_seed():
    assert pools(500, 4, 3, seed=5) == pools(500, 4, 3, seed=5)
    assert pools(500, 4, 3, seed=5) != pools(500, 4, 3, seed=6)
    a = BatchStream(500, 1, 4, 8, "replicate:3", seed=5)
    b = BatchStream(500, 1, 4, 8, "replicate:3", seed=5)
    assert [a.next().tolist() for _ in range(200)] == [b.next().tolist() for _ in range(200)]


def test_one_copy_deals_a_disjoint_shard_of_every_sample():
    ps = pools(103, 4, 1)
    assert sorted(i for p in ps for i in p) == list(range(103))


@pytest.mark.parametrize("value", ["replicate:0", "replicate:x", "replicate:", f"replicate:{MAX_COPIES + 1}",
                                   "replicate:-2", "replicate", "shards", 11])
def test_a_malformed_partition_is_refused_naming_the_form(value):
    with pytest.raises(ConfigError, match="replicate:K"):
        parse_partition(value)


def test_parse_partition_reads_each_form():
    assert parse_partition("shard") == ("shard", 1)
    assert parse_partition("iid") == ("iid", 1)
    assert parse_partition("replicate:11") == ("replicate", 11)


def test_an_epoch_counts_the_data_set_given_under_every_layout():
    """The budget is N samples an epoch, whatever the layout: the same number of server updates."""
    train, test = blobs(n=256, seed=0), blobs(n=64, seed=1)
    runs = {p: sg.train("logreg", train, test, algorithm="asgd", workers=4, epochs=2, batch_size=16, lr=0.1,
                        partition=p, seed=1)
            for p in ("shard", "replicate:5")}
    assert runs["shard"].summary["updates"] == runs["replicate:5"].summary["updates"] == 2 * 256 // 16
    assert runs["shard"].summary["weights_sha256"] != runs["replicate:5"].summary["weights_sha256"]
    again = sg.train("logreg", train, test, algorithm="asgd", workers=4, epochs=2, batch_size=16, lr=0.1,
                     partition="replicate:5", seed=1)
    assert again.summary["weights_sha256"] == runs["replicate:5"].summary["weights_sha256"]


def test_the_cli_takes_the_layout_and_refuses_a_bad_one_in_one_line(tmp_path, capsys):
    base = ["train", "--workers", "4", "--dataset", "digits", "--model", "logreg", "--epochs", "1", "--quiet"]
    assert main(base + ["--partition", "replicate:11", "--out", str(tmp_path / "ok")]) == 0
    assert (tmp_path / "ok" / "summary.json").exists()
    capsys.readouterr()
    assert main(base + ["--partition", "replicate:0", "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--partition" in err[0] and "replicate:K" in err[0]
    assert not (tmp_path / "bad").exists()


def test_a_batch_larger_than_a_replicated_slice_is_refused_before_the_run():
    train, test = blobs(n=64, seed=0), blobs(n=32, seed=1)
    # 2 copies of 64 over 8 workers: 16 rows each; a batch of 17 cannot be drawn
    with pytest.raises(ConfigError, match="batch_size"):
        sg.train("logreg", train, test, algorithm="asgd", workers=8, batch_size=17, partition="replicate:2")
    assert math.isfinite(sg.train("logreg", train, test, algorithm="asgd", workers=8, batch_size=16,
                                  partition="replicate:2").summary["final_test_acc"])
