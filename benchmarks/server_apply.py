"""Server apply: time per update of each rule through ParameterServer.push, on each kernel path.

    .venv/bin/python benchmarks/server_apply.py --quick           # 1M parameters (make bench)
    .venv/bin/python benchmarks/server_apply.py                   # 1M and 10M, more rounds
    .venv/bin/python benchmarks/server_apply.py --rules dcasgd-a  # one rule (and asgd, the reference)

The real path, NaN/Inf checks included, on flat float32 vectors, on both kernel
paths in the same rounds: "torch" (the rules' torch operators) and "numba" (the
fused kernels of stalegrad/algorithms/fused.py; skipped without numba). Bytes an
update must move: read the gradient and the weights (and the worker's
snapshot, its MeanSquare, the momenta of DANA), write the weights (and the
state the rule updates: see RULES). The
roofline is a large memory copy, ``dst.copy_(src)``, counted as bytes read
plus written, timed in the same rounds.
"""
from __future__ import annotations

import gc

import common
import torch

# rule -> (algorithm, its parameters, float32 vectors each update must read + write)
RULES = {
    "asgd": ("asgd", {}, 3),                  # read g, w; write w
    "asgd+momentum": ("asgd", {"momentum": 0.9, "weight_decay": 1e-4}, 5),   # read g, w, buf; write w, buf
    "dcasgd-c": ("dcasgd-c", {}, 4),          # read g, w, w_bak[m]; write w
    "dcasgd-a": ("dcasgd-a", {}, 6),          # read g, w, w_bak[m], ms[m]; write w, ms[m]
    "dynsgd": ("dynsgd", {}, 3),              # read commit, w; write w
    "agn": ("agn", {}, 3),                    # read commit, w; write w
    # the gradient rules after 2017
    "sasgd": ("sasgd", {}, 3),                # read g, w; write w (torch's add on both paths)
    "sasgd+momentum": ("sasgd", {"momentum": 0.9, "weight_decay": 1e-4}, 5),   # read g, w, buf; write w, buf
    "gap-aware": ("gap-aware", {}, 6),        # read g, w, w_bak[m], v; write w, v
    "dana-zero": ("dana-zero", {}, 7),        # read g, w, v[m], sum(v); write w, v[m], sum(v)
    "dana-dc": ("dana-dc", {}, 8),            # read g, w, w_hat[m], v[m], sum(v); write w, v[m], sum(v)
    # async-local-sgd's delayed nesterov (N = the 4 workers): each time is the best of >= 3 pushes, so
    # the first two rows time the 3 in 4 updates that do not move the momentum, the third the N-th update
    "async-local-sgd": ("async-local-sgd", {}, 5),                 # c = 0: read c, w, D; write w, D
    "async-local-sgd+c": ("async-local-sgd", {"dn_c": 0.2}, 6),    # read c, w, D, b; write w, D
    "async-local-sgd N-th": ("async-local-sgd", {"dn_delay": 1}, 7),   # every update: read c, w, D, b; write w, D, b
}
WORKERS = 4
TARGET_FRACTION = 0.5
TARGET_DCA_VS_ASGD = 2.0


def op_costs(n: int, quick: bool) -> dict:
    """Each tensor operation a rule is made of, alone, in units of the copy's time."""
    gen = torch.Generator().manual_seed(1)
    a, b, c = (torch.rand(n, generator=gen).add_(0.5) for _ in range(3))
    out, src, dst = torch.empty(n), torch.randn(n, generator=gen), torch.empty(n)
    items = {
        "copy (dst.copy_(src))": lambda: dst.copy_(src),
        "aminmax(g)  [NaN/Inf check]": lambda: torch.aminmax(a),
        "w.add_(g, alpha=-lr)": lambda: b.add_(a, alpha=-1e-9),
        "ms.mul_(m)": lambda: c.mul_(1.0),
        "torch.sub(w, w_bak, out=)": lambda: torch.sub(a, b, out=out),
        "ms.addcmul_(g, g)": lambda: c.addcmul_(a, a, value=0.0),
        "x.sqrt_()": lambda: out.copy_(c).sqrt_(),
        "torch.addcdiv(g, x, d, out=)": lambda: torch.addcdiv(a, b, c, value=1e-9, out=out),
    }
    for f in items.values():
        f()
    times = common.interleaved(items, 3 if quick else 5, 3 if quick else 5)
    base = times["copy (dst.copy_(src))"]
    sqrt = [s - c for s, c in zip(times["x.sqrt_()"], base)]   # minus the copy that refills x
    times["x.sqrt_()"] = sqrt
    return {k: {"ms": common.median(v) * 1e3, "x_copy": common.median_ratio(v, base)} for k, v in times.items()}


def run(quick: bool = False, rules: list[str] | None = None) -> dict:
    """``rules``: time only these (and asgd, the reference of "time vs asgd"); default: every rule."""
    sizes = [1_000_000] if quick else [1_000_000, 10_000_000]
    paths = common.kernel_paths()
    unknown = sorted(set(rules or ()) - RULES.keys())
    if unknown:
        raise ValueError(f"unknown rule {unknown[0]!r}; choose from {', '.join(RULES)}")
    timed = [r for r in RULES if rules is None or r == "asgd" or r in rules]
    rows, ops = [], {}
    for n in sizes:
        gen = torch.Generator().manual_seed(0)
        src, dst = torch.randn(n, generator=gen), torch.empty(n)
        servers = {(rule, path): common.pushing_server(*RULES[rule][:2], n, gen, path, WORKERS)
                   for path in paths for rule in timed}
        items = {"copy": lambda: dst.copy_(src)}
        for key, (server, msg) in servers.items():
            # push from worker 1 again and again: its snapshot (and MeanSquare) are read every time
            items[key] = (lambda s=server, g=msg: s.push(1, g, common.PUSH_LR))
            items[key]()   # warm: first touch of every buffer
        small = n <= 2_000_000
        rounds = 5 if quick else 7
        calls = 10 if small else 4
        times = common.interleaved(items, rounds, calls)
        copy_t = common.median(times["copy"])
        copy_bw = 2 * 4 * n / copy_t
        for (name, path) in servers:
            vectors = RULES[name][2]
            t = times[(name, path)]
            # bytes/s as a fraction of copy bandwidth = (vectors/2) * t_copy / t, per round
            frac = common.median([(vectors / 2) * c / x for x, c in zip(t, times["copy"])])
            row = {"n": n, "rule": name, "kernels": path, "ms": common.median(t) * 1e3, "vectors": vectors,
                   "gb_s": vectors * 4 * n / common.median(t) / 1e9, "fraction_of_copy": frac,
                   "vs_asgd": common.median_ratio(t, times[("asgd", path)]),
                   "vs_torch_path": common.median_ratio(t, times[(name, "torch")]),
                   "copy_gb_s": copy_bw / 1e9, "copy_ms": copy_t * 1e3}
            rows.append(row)
        servers.clear(), items.clear()
        del src, dst
        gc.collect()
        ops[str(n)] = op_costs(n, quick)
    best = [r for r in rows if r["kernels"] == paths[-1]]   # the path the server takes by default
    ok_frac = all(r["fraction_of_copy"] >= TARGET_FRACTION for r in best)
    ok_ratio = all(r["vs_asgd"] <= TARGET_DCA_VS_ASGD for r in best if r["rule"] == "dcasgd-a")
    return {
        "rows": rows, "op_costs": ops, "kernels": paths, "fused": fused_info(), "rules": timed,
        "targets": {"fraction_of_copy >= 0.5 (every rule)": ok_frac, "dcasgd-a / asgd <= 2": ok_ratio},
    }


def fused_info() -> dict:
    from stalegrad.algorithms import fused
    return fused.describe()


def op_table(ops: dict) -> dict:
    sizes = list(ops)
    names = list(ops[sizes[0]])
    cols = ["operation"] + [f"{int(n) / 1e6:g}M: ms (x copy)" for n in sizes]
    body = [[name] + [f"{ops[n][name]['ms']:.3f} ({ops[n][name]['x_copy']:.2f})" for n in sizes] for name in names]
    return common.page_table("One tensor operation alone, time as a multiple of a copy's", cols, body)


def table(rows: list[dict], paths: list[str]) -> dict:
    """One row per size and rule: each path's time, and on the default path (the last) the fraction of copy
    bandwidth and the time against asgd's."""
    default = paths[-1]
    cols = ["params", "rule", "vectors"] + [f"{p}: ms" for p in paths]
    cols += ([f"{default} / torch time"] if len(paths) > 1 else [])
    cols += [f"{default}: fraction of copy (>= 0.5)", f"{default}: time vs asgd"]
    by_key = {(r["n"], r["rule"], r["kernels"]): r for r in rows}
    body = []
    for (n, rule, path), r in by_key.items():
        if path != default:
            continue
        cells = [f"{n / 1e6:g}M", rule, r["vectors"]] + [f"{by_key[(n, rule, p)]['ms']:.3f}" for p in paths]
        cells += [f"{r['vs_torch_path']:.2f}"] if len(paths) > 1 else []
        target = " (<= 2)" if rule == "dcasgd-a" else ""
        cells += [f"{r['fraction_of_copy']:.2f} {common.verdict(r['fraction_of_copy'] >= TARGET_FRACTION)}",
                  f"{r['vs_asgd']:.2f}{target}"]
        body.append(cells)
    copy = ", ".join(f"{n / 1e6:g}M {r['copy_gb_s']:.0f} GB/s" for (n, rule, path), r in by_key.items()
                     if rule == "asgd" and path == default)
    return common.page_table(f"Time per push, worker 1 of {WORKERS} (copy bandwidth: {copy})", cols, body)


def main(argv=None) -> int:
    ap = common.options(__doc__)
    ap.add_argument("--rules", default=None, help="comma-separated rules to time (and asgd, the reference of "
                    "'time vs asgd') [default: every rule]")
    args = ap.parse_args(argv)
    common.settle(ap, args)
    bench = common.Benchmark("server_apply", args.quick)
    try:
        result = run(args.quick, args.rules.split(",") if args.rules else None)
    except ValueError as e:
        ap.error(str(e))
    targets = "; ".join(f"{k}: {common.verdict(v)}" for k, v in result["targets"].items())
    ops = op_table(result["op_costs"])   # printed, and kept in the JSON's data; the page shows the pushes only
    print(f"\n{ops['title']}\n\n{common.table(ops['columns'], ops['rows'])}")
    bench.finish([table(result["rows"], result["kernels"])], result, notes=[f"targets: {targets}"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
