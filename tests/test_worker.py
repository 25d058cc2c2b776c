"""The worker side: FlatModel, BatchStream, Worker and WorkerFactory, checked
against plain PyTorch computations and against independently drawn streams."""
import copy
import dataclasses
import io
import math

import pytest
import torch
from torch import nn

from stalegrad.algorithms import make_algorithm
from stalegrad.core.worker import BatchStream, FlatModel, Worker, WorkerFactory

from helpers import blobs

DATA = blobs(n=48, d=8, classes=3, seed=3)


def linear():
    torch.manual_seed(0)
    return nn.Linear(8, 3)


def with_batchnorm():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 3))


def trainable(module):
    return [p for p in module.parameters() if p.requires_grad]


def set_weights(module, w):
    """Load the flat vector ``w`` into a plain module, parameter by parameter."""
    offset = 0
    with torch.no_grad():
        for p in trainable(module):
            p.copy_(w[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
    assert offset == len(w)


def plain_loss_and_grad(module, w, x, y):
    """Cross-entropy written out (mean of -log softmax at the label) and its gradient by autograd."""
    set_weights(module, w)
    module.train()
    logp = torch.log_softmax(module(x), dim=1)
    loss = -logp[torch.arange(len(y)), y].mean()
    grads = torch.autograd.grad(loss, trainable(module))
    return loss.item(), torch.cat([g.reshape(-1) for g in grads])


def close(a, b, rtol=1e-5, atol=1e-6):
    # torch.testing.assert_close would do, but its first call imports torch.distributed (~0.6 s).
    assert a.shape == b.shape and torch.allclose(a, b, rtol=rtol, atol=atol), (a - b).abs().max()
    return True


def random_weights(n, seed):
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


# ---- FlatModel -----------------------------------------------------------------------------
def test_parameters_and_grads_are_views_of_the_flat_vectors():
    module = with_batchnorm()
    before = torch.cat([p.detach().reshape(-1).clone() for p in trainable(module)])
    fm = FlatModel(module)
    assert fm.numel == len(before) == 8 * 6 + 6 + 6 + 6 + 6 * 3 + 3
    assert torch.equal(fm.flat, before)            # the initial weights are kept
    params = trainable(fm.module)
    # Writing into flat writes the parameters, element for element, in parameter order.
    fm.flat.copy_(torch.arange(fm.numel, dtype=torch.float32))
    offset = 0
    for p in params:
        expected = torch.arange(offset, offset + p.numel(), dtype=torch.float32).view_as(p)
        assert torch.equal(p.detach(), expected)
        offset += p.numel()
    # ... and a backward pass lands in grad.
    assert not fm.grad.any()
    fm.module(DATA.x[:10]).square().sum().backward()
    assert fm.grad.abs().sum() > 0
    assert torch.equal(fm.grad, torch.cat([p.grad.reshape(-1) for p in params]))
    # The running statistics of BatchNorm are buffers, not parameters: not in flat.
    assert fm.numel == sum(p.numel() for p in params)


def test_frozen_parameters_stay_out_of_the_flat_vector():
    module = nn.Sequential(nn.Linear(8, 4), nn.Linear(4, 3))
    module[0].requires_grad_(False)
    fm = FlatModel(module)
    assert fm.numel == 4 * 3 + 3
    frozen = module[0].weight.detach().clone()
    fm.flat.zero_()
    assert torch.equal(module[0].weight.detach(), frozen) and not module[1].weight.any()


def test_loss_and_grad_is_plain_cross_entropy_and_its_gradient():
    for make in (linear, with_batchnorm):
        reference = make()
        fm = FlatModel(make())
        for seed in (1, 2):   # twice: the gradient of the second call must not accumulate on the first
            w = random_weights(fm.numel, seed)
            x, y = DATA.x[seed * 8:seed * 8 + 16], DATA.y[seed * 8:seed * 8 + 16]
            loss, g = fm.loss_and_grad(w, x, y)
            ref_loss, ref_g = plain_loss_and_grad(reference, w, x, y)
            assert loss == pytest.approx(ref_loss, rel=1e-6)
            assert close(g, ref_g)
            assert g.data_ptr() == fm.grad.data_ptr()     # a view of grad, not a copy
            assert torch.equal(fm.flat, w) and fm.module.training


def test_a_mini_batch_uses_the_callers_vector_in_place_and_load_never_writes_into_it():
    """loss_and_grad computes at the caller's vector itself (no copy per local step), with the bits of a copy;
    afterwards ``load`` (evaluation, the returned module) copies into the model's own vector, so the vector
    used in place (say, a commit about to be pushed) keeps its values."""
    copied = FlatModel(with_batchnorm())
    fm = FlatModel(with_batchnorm())
    own = fm.flat
    w = random_weights(fm.numel, 5)
    x, y = DATA.x[:16], DATA.y[:16]
    loss, g = fm.loss_and_grad(w, x, y)
    first = trainable(fm.module)[0]
    assert first.data_ptr() == w.data_ptr() and fm.flat is w          # used in place, not copied
    copied.load(w)                                                       # the copying path, for the same bits
    ref_loss, ref_g = copied.loss_and_grad(copied.flat, x, y)
    assert loss == ref_loss and torch.equal(g, ref_g)
    # a local step in place, then the next mini-batch: the model sees the new values without a copy
    w.add_(g, alpha=-0.1)
    loss2, g2 = fm.loss_and_grad(w, x, y)
    copied.load(w)
    ref2 = copied.loss_and_grad(copied.flat, x, y)
    assert (loss2, g2.tolist()) == (ref2[0], ref2[1].tolist())
    # the caller turns w into its message; loading other weights must not touch it
    w.mul_(-1.0)
    message = w.clone()
    other = random_weights(fm.numel, 6)
    fm.evaluate(other, DATA.x, DATA.y)
    assert torch.equal(w, message)                                       # nothing written into w
    assert fm.flat is own and torch.equal(own, other) and first.data_ptr() == own.data_ptr()


def test_a_vector_not_laid_out_as_the_models_own_is_copied():
    """Unaligned (a view one float into a larger vector), another dtype or not contiguous: copied, as before."""
    fm = FlatModel(linear())
    x, y = DATA.x[:16], DATA.y[:16]
    base = random_weights(fm.numel + 1, 7)
    for w in (base[1:], base[:fm.numel].double(), random_weights(2 * fm.numel, 8)[::2]):
        loss, g = fm.loss_and_grad(w, x, y)
        assert fm.flat.data_ptr() != w.data_ptr() and torch.equal(fm.flat, w.float())
        ref_loss, ref_g = plain_loss_and_grad(linear(), w.float(), x, y)
        assert loss == pytest.approx(ref_loss, rel=1e-6) and close(g, ref_g)


def test_evaluate_is_plain_mean_loss_and_accuracy():
    fm = FlatModel(linear())
    reference = linear()
    w = random_weights(fm.numel, 5)
    set_weights(reference, w)
    with torch.no_grad():
        logits = reference(DATA.x)
        per_sample = -torch.log_softmax(logits, dim=1)[torch.arange(len(DATA.y)), DATA.y]
        accuracy = sum(int(row.argmax()) == int(label) for row, label in zip(logits, DATA.y)) / len(DATA.y)
    assert 0 < accuracy < 1                      # a case where counting matters
    loss, acc = fm.evaluate(w, DATA.x, DATA.y, batch_size=7)   # 48 samples: a short last batch
    assert loss == pytest.approx(per_sample.mean().item(), rel=1e-6)
    assert acc == pytest.approx(accuracy)


def test_evaluate_gives_a_nan_model_nan_accuracy_not_the_share_of_class_0():
    fm = FlatModel(linear())
    w = random_weights(fm.numel, 5)
    w[0] = float("nan")                   # one weight of the first output row: class 0's logit is NaN
    share_of_class_0 = (DATA.y == 0).float().mean().item()
    assert 0 < share_of_class_0 < 1       # what argmax over NaN logits used to score (index 0 every row)
    loss, acc = fm.evaluate(w, DATA.x, DATA.y, batch_size=7)
    assert math.isnan(loss) and math.isnan(acc)
    w = random_weights(fm.numel, 5)
    w[-1] = float("inf")                  # the last bias: class 2's logit is +inf in every row, the loss NaN
    loss, acc = fm.evaluate(w, DATA.x, DATA.y, batch_size=7)
    assert not math.isfinite(loss) and math.isnan(acc)
    loss, acc = fm.evaluate(random_weights(fm.numel, 5), DATA.x, DATA.y)
    assert math.isfinite(loss) and 0 < acc < 1   # a finite model still counts


def test_evaluate_uses_eval_mode_and_training_returns_to_train_mode():
    fm = FlatModel(with_batchnorm())
    w = random_weights(fm.numel, 6)
    fm.loss_and_grad(w, DATA.x[:16], DATA.y[:16])          # moves the running statistics
    reference = copy.deepcopy(fm.module).eval()
    with torch.no_grad():
        logits = reference(DATA.x)
    expected = torch.nn.functional.cross_entropy(logits, DATA.y).item()
    loss, acc = fm.evaluate(w, DATA.x, DATA.y, batch_size=5)
    assert not fm.module.training
    assert loss == pytest.approx(expected, rel=1e-5)
    assert acc == pytest.approx((logits.argmax(1) == DATA.y).float().mean().item())
    # Back to training: batch statistics again, as a plain module in train mode computes.
    after = copy.deepcopy(fm.module)
    loss, g = fm.loss_and_grad(w, DATA.x[16:32], DATA.y[16:32])
    ref_loss, ref_g = plain_loss_and_grad(after, w, DATA.x[16:32], DATA.y[16:32])
    assert fm.module.training and loss == pytest.approx(ref_loss, rel=1e-6)
    assert close(g, ref_g)


def test_a_model_without_trainable_parameters_is_refused():
    with pytest.raises(ValueError, match="no trainable parameters"):
        FlatModel(nn.ReLU())
    with pytest.raises(ValueError, match="no trainable parameters"):
        FlatModel(nn.Linear(8, 3).requires_grad_(False))


# ---- BatchStream ---------------------------------------------------------------------------
def draw(stream, batches):
    return [i for _ in range(batches) for i in stream.next().tolist()]


def test_shards_are_disjoint_and_cover_the_set():
    n, M = 103, 4
    pools = [BatchStream(n, m, M, 5, "shard", seed=2).pool.tolist() for m in range(M)]
    assert sorted(i for pool in pools for i in pool) == list(range(n))     # disjoint and complete
    assert sorted(len(p) for p in pools) == [25, 26, 26, 26]
    assert pools != [sorted(p) for p in pools]   # a permutation of the set, not contiguous ranges
    iid = BatchStream(n, 1, M, 5, "iid", seed=2)
    assert sorted(iid.pool.tolist()) == list(range(n))


@pytest.mark.parametrize("partition, batch", [("shard", 5), ("shard", 7), ("iid", 9)])
def test_every_pass_visits_each_sample_of_the_pool_once(partition, batch):
    s = BatchStream(100, 2, 4, batch, partition, seed=4)
    pool = sorted(s.pool.tolist())
    seen = draw(s, 4 * len(pool) // batch)         # about four passes, batches straddling passes
    passes = [seen[i:i + len(pool)] for i in range(0, len(seen) - len(pool) + 1, len(pool))]
    assert len(passes) >= 3
    for one in passes:
        assert sorted(one) == pool
    assert passes[0] != passes[1]                  # reshuffled at every pass


def test_streams_are_deterministic_per_seed_and_differ_across_seeds_and_workers():
    a = draw(BatchStream(60, 1, 3, 4, "shard", seed=7), 12)
    b = draw(BatchStream(60, 1, 3, 4, "shard", seed=7), 12)
    c = draw(BatchStream(60, 1, 3, 4, "shard", seed=8), 12)
    assert a == b and a != c
    iid = [draw(BatchStream(60, m, 3, 4, "iid", seed=7), 5) for m in range(3)]
    assert iid[0] != iid[1] and iid[1] != iid[2] and iid[0] != iid[2]


def test_a_pass_boundary_carries_the_tail_into_the_next_batch():
    s = BatchStream(7, 0, 1, 3, seed=0)                  # 7 samples, batches of 3
    first_pass = s.order.tolist()
    b1, b2, b3 = (s.next().tolist() for _ in range(3))
    assert b1 + b2 == first_pass[:6]
    assert b3[0] == first_pass[6]                       # the tail opens the next batch ...
    second_pass = b3[1:] + draw(s, 2)[:5]               # ... followed by a fresh pass
    assert sorted(second_pass) == list(range(7))


def test_extend_adopts_indices_into_this_pass_and_every_later_one():
    s = BatchStream(40, 0, 4, 5, seed=3)                # a shard of 10
    own = sorted(s.pool.tolist())
    first = s.next().tolist()
    extra = list(range(100, 105))
    s.extend(torch.tensor(extra))
    assert sorted(s.pool.tolist()) == sorted(own + extra)
    rest = draw(s, 2)                                   # the rest of this pass: 5 own + 5 adopted
    assert sorted(first + rest) == sorted(own + extra)
    for _ in range(3):                                  # later passes are all 15
        assert sorted(draw(s, 3)) == sorted(own + extra)


def test_state_dict_resumes_the_exact_sequence():
    a = BatchStream(50, 1, 2, 6, seed=11)
    draw(a, 3)
    a.extend(torch.arange(200, 204))
    draw(a, 2)
    state = a.state_dict()
    assert set(state) >= {"pool", "order", "pos", "rng"}
    buffer = io.BytesIO()
    torch.save(state, buffer)
    # Another seed, another worker: every bit of the future comes from the state.
    b = BatchStream(50, 0, 2, 6, seed=99)
    b.load_state_dict(torch.load(io.BytesIO(buffer.getvalue())))
    assert torch.equal(b.pool, a.pool)
    assert draw(b, 20) == draw(a, 20)                   # several passes over the extended pool


def test_a_batch_larger_than_a_shard_is_refused():
    with pytest.raises(ValueError, match="batch size 5 is larger than worker 0's 3 samples"):
        BatchStream(10, 0, 4, 5, "shard")
    BatchStream(10, 0, 4, 5, "iid")                    # the whole set is big enough
    with pytest.raises(ValueError, match="partition must be shard, iid or replicate:K"):
        BatchStream(10, 0, 4, 5, "random")


# ---- Worker and WorkerFactory --------------------------------------------------------------
def factory(algorithm, model, seed=0, **kw):
    return WorkerFactory(algorithm, num_workers=3, batch_size=4, partition="shard", seed=seed,
                         x=DATA.x, y=DATA.y, w0=model.flat.clone(), model=model, **kw)


def test_compute_returns_the_mini_batch_loss_and_its_gradient():
    f = factory(make_algorithm("asgd"), FlatModel(linear()))
    worker = f.build(1)
    assert isinstance(worker, Worker) and worker.samples_per_message == 4
    twin = BatchStream(len(DATA.y), 1, 3, 4, "shard", seed=0)   # the batches worker 1 must draw
    reference = linear()
    for seed in (1, 2):
        pulled = random_weights(f.model.numel, seed)
        loss, computed = worker.compute(pulled, lr=0.1)
        idx = twin.next()
        ref_loss, ref_g = plain_loss_and_grad(reference, pulled, DATA.x[idx], DATA.y[idx])
        assert loss == pytest.approx(ref_loss, rel=1e-6)
        assert close(worker.message(pulled, computed), ref_g)


def test_agn_commit_is_window_adam_steps():
    lr, beta1, beta2, eps = 0.05, 0.9, 0.999, 1e-8
    f = factory(make_algorithm("agn", window=2), FlatModel(linear()))
    worker = f.build(0)
    twin = BatchStream(len(DATA.y), 0, 3, 4, "shard", seed=0)
    reference = linear()
    pulled = random_weights(f.model.numel, 3)
    # Adam as the paper writes it (Kingma and Ba, Algorithm 1), in float64; torch.optim.Adam
    # would do as well, but building one first imports torch._dynamo (~1 s).
    w, m, v, losses = pulled.double(), 0.0, 0.0, []
    for t in (1, 2):
        idx = twin.next()
        loss, g = plain_loss_and_grad(reference, w.float(), DATA.x[idx], DATA.y[idx])
        g = g.double()
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        w = w - lr * (m / (1 - beta1 ** t)) / ((v / (1 - beta2 ** t)).sqrt() + eps)
        losses.append(loss)
    loss, computed = worker.compute(pulled, lr)
    assert loss == pytest.approx(sum(losses) / 2, rel=1e-5)
    assert close(worker.message(pulled, computed), ((w - pulled.double()) / 2).float(), rtol=1e-4)


def run_messages(worker, w, rounds, lr=0.05):
    """``rounds`` pull/compute/push cycles against a plain server (w += message); the messages."""
    out = []
    for _ in range(rounds):
        loss, computed = worker.compute(w, lr)
        msg = worker.message(w, computed).clone()       # asgd's message is a view of the model's grad
        out.append(msg)
        w = w + (-lr * msg if worker.algorithm.name == "asgd" else msg)
    return out


def checkpointed(state):
    """``state`` through torch.save and torch.load, as a checkpoint carries it. Loaded directly,
    a state dict shares its tensors (the Adam moments) with the worker it came from, as
    torch.optim.Optimizer's does: the two would then step the same moments."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return torch.load(io.BytesIO(buffer.getvalue()))


@pytest.mark.parametrize("algo, params", [("agn", {"window": 2}), ("asgd", {})])
def test_worker_restored_from_a_state_dict_sends_the_same_messages(algo, params):
    algorithm = make_algorithm(algo, **params)
    f = factory(algorithm, FlatModel(linear()))
    w = f.w0.clone()
    a = f.build(2)
    run_messages(a, w, 3)                                # Adam moments, a stream past a pass boundary
    state = checkpointed(a.state_dict())
    # Built by a factory with another seed: the stream and the local optimizer come from the state.
    b = dataclasses.replace(f, seed=1).build(2)
    b.load_state_dict(state)
    unloaded = dataclasses.replace(f, seed=1).build(2)
    stream_only = dataclasses.replace(f, seed=1).build(2)
    stream_only.stream.load_state_dict(checkpointed(a.state_dict())["stream"])
    expected = run_messages(a, w, 4)
    got = run_messages(b, w, 4)
    assert len(got) == 4 and all(torch.equal(x, y) for x, y in zip(got, expected))
    # Neither half of the state is decoration: without it the next message differs.
    assert not torch.equal(run_messages(unloaded, w, 1)[0], expected[0])
    if algo == "agn":   # the local optimizer's moments and step count
        assert not torch.equal(run_messages(stream_only, w, 1)[0], expected[0])


def test_factory_builds_the_same_worker_twice_and_travels_without_a_model():
    model = FlatModel(linear())
    f = factory(make_algorithm("asgd"), model)
    one, two = f.build(1), f.build(1)
    assert one.stream is not two.stream and draw(one.stream, 15) == draw(two.stream, 15)
    assert set(f.build(0).stream.pool.tolist()).isdisjoint(f.build(1).stream.pool.tolist())
    assert one.model is model

    x, y = DATA.x.clone(), DATA.y.clone()
    portable = f.portable(x, y)
    assert portable.model is None and portable.w0 is None and portable.x is x and portable.y is y
    with pytest.raises(ValueError, match="without a model or weights"):
        portable.build(0)
    with pytest.raises(ValueError, match="without a model or weights"):
        portable.build(0, model=FlatModel(linear()))
    elsewhere = portable.build(1, model=FlatModel(linear()), w0=f.w0)
    assert draw(elsewhere.stream, 15) == draw(f.build(1).stream, 15)
    assert elsewhere.x is x                              # on the same device: no copy
