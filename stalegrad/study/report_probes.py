"""The probes section of ``stalegrad report``: runs made with ``--probe-every`` (``probes.jsonl``).

Two questions, one table each (and a plot each):

- **Delay compensation** (gradient rules): per group, the probes binned by tau; in each bin the
  median relative error and median cosine against the fresh gradient ``g_now`` of the stale
  gradient ``g``, of the DC-ASGD-c and DC-ASGD-a corrections and of the first-order prediction
  with the exact Hessian diagonal, the share of probes where each correction is closer to
  ``g_now`` than ``g`` is, and the correlation of ``g*g`` with the Hessian diagonal.
- **Alignment** (every probed rule): per group (algorithm, workers, window), the mean cosine of
  the update with minus the gradient of the probes' fixed batch and with the previous update of
  another worker, and the median update norm.
"""
from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

GUESSES = (("g", "stale g"), ("dc_c", "DC-ASGD-c"), ("dc_a", "DC-ASGD-a"), ("taylor", "diag(H)"), ("full_h", "full H"))
PROBES_FILE = "probes.jsonl"


# What every probe record holds (numbers, or null for a non-finite one), beside its integer tau.
PROBE_NUMBERS = ("cos_eval", "cos_prev", "update_norm")


def read_probes(run_dir) -> list[dict] | None:
    """The probes of a run, None if it has none; ``DamagedRun`` for a file that is no probes file."""
    from ..run.files import JSONL_LIMIT, UnreadableFile, loads_json, read_text
    from ..run.results import DamagedRun, is_number
    d = Path(run_dir)
    try:
        text = read_text(d / PROBES_FILE, JSONL_LIMIT)
    except FileNotFoundError:
        return None
    except UnreadableFile as e:
        raise DamagedRun(d, f"{PROBES_FILE} {e.reason}") from None
    probes = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            p = loads_json(line)
        except json.JSONDecodeError as e:   # (nested too deeply, an integer of too many digits too)
            raise DamagedRun(d, f"{PROBES_FILE} is corrupt (line {i} is not JSON: {e.msg})") from None
        if not _is_probe(p, is_number):
            raise DamagedRun(d, f"{PROBES_FILE} line {i} is not a probe record")
        probes.append(p)
    return probes


def _is_probe(p, is_number) -> bool:
    """Whether ``p`` has every key the tables read, as numbers or null (what the prober writes)."""
    if not isinstance(p, dict) or not isinstance(p.get("tau"), int) or isinstance(p["tau"], bool) or p["tau"] < 0:
        return False
    need = list(PROBE_NUMBERS)
    if "err_g" in p:
        need += ["drift", *(f"{kind}_{key}" for key, _ in GUESSES if f"err_{key}" in p for kind in ("err", "cos"))]
    if "corr_h_gg" in p:
        need.append("lam_fit")
    return all(k in p and (p[k] is None or is_number(p[k])) for k in need)


def tau_bin(tau: int) -> tuple[int, int]:
    """0, 1, 2-3, 4-7, 8-15, ...: powers of two, so that every M gets a few bins."""
    if tau <= 1:
        return tau, tau
    low = 1 << (tau.bit_length() - 1)
    return low, 2 * low - 1


def _median(values) -> float | None:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.median(vals) if vals else None


def _closer(err, than) -> bool:
    """err < than, where an error that JSON wrote as null (an overflow: inf or NaN) is never closer, and any
    finite error is closer than one."""
    return err is not None and math.isfinite(err) and (than is None or not math.isfinite(than) or err < than)


def _mean(values) -> float | None:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.fmean(vals) if vals else None


def compensation_bins(probes: list[dict]) -> list[dict]:
    """The gradient probes of one run or group, binned by tau."""
    bins: dict[tuple[int, int], list[dict]] = {}
    for p in probes:
        if "err_g" in p:
            bins.setdefault(tau_bin(p["tau"]), []).append(p)
    rows = []
    for (low, high), ps in sorted(bins.items()):
        row = {"tau": [low, high], "n": len(ps), "drift": _median(p["drift"] for p in ps)}
        for key, _ in GUESSES:
            if all(f"err_{key}" in p for p in ps):
                row[f"err_{key}"] = _median(p[f"err_{key}"] for p in ps)
                row[f"cos_{key}"] = _median(p[f"cos_{key}"] for p in ps)
                if key != "g":
                    row[f"better_{key}"] = sum(_closer(p[f"err_{key}"], p["err_g"]) for p in ps) / len(ps)
        if all("corr_h_gg" in p for p in ps):
            row["corr_h_gg"] = _median(p["corr_h_gg"] for p in ps)
            row["lam_fit"] = _median(p["lam_fit"] for p in ps)
        rows.append(row)
    return rows


def alignment_row(probes: list[dict]) -> dict:
    return {"n": len(probes), "cos_eval": _mean(p["cos_eval"] for p in probes),
            "cos_prev": _mean(p["cos_prev"] for p in probes), "update_norm": _median(p["update_norm"] for p in probes),
            "tau_mean": _mean(p["tau"] for p in probes)}


def analyse_probes(groups: list[dict]) -> dict:
    """{"compensation": [...], "alignment": [...]} over the groups whose runs wrote probes."""
    compensation, alignment = [], []
    for g in groups:
        probes = [p for r in g["runs"] for p in ((r["probes"] if "probes" in r else read_probes(r["dir"])) or [])]
        if not probes:
            continue
        key = g["key"]
        setting = {"algo": g["algo"], "workers": key.get("workers"), "window": key.get("window"),
                   "dataset": key.get("dataset"), "model": key.get("model")}
        alignment.append({"label": g["label"], **setting, **alignment_row(probes)})
        bins = compensation_bins(probes)
        if bins:
            compensation.append({"label": g["label"], **setting, "bins": bins})
    return {"compensation": compensation, "alignment": alignment}


def _f(v, spec=".3f") -> str:
    return "–" if v is None else format(v, spec)


def render_probes(section: dict, plots: dict) -> list[str]:
    """The markdown of the probes section (nothing when no run wrote probes)."""
    if not section["compensation"] and not section["alignment"]:
        return []
    out = ["## Probes (`--probe-every`)", ""]
    if section["compensation"]:
        out += ["### Delay compensation: the stale gradient and its corrections against the fresh one", "",
                "Per tau bin: the median relative error `|x - g_now| / |g_now|` and the median cosine with "
                "`g_now` (the gradient at the server's weights on the same mini-batch), and the share of probes "
                "where a correction is closer to `g_now` than the stale `g` is. `full H`: the first-order prediction "
                "`g + H (w - w_bak)` with the whole Hessian at the pulled weights (the first-order error alone); "
                "`diag(H)`: with its exact diagonal only (adds the diagonal's error); DC-ASGD-c/-a: with "
                "`lam*g*g` (adds the error of `g*g`); `corr`: the median "
                "correlation of `g*g` with that diagonal; `lam*`: the median least-squares lambda of "
                "`diag(H) ~ lam*g*g`; drift: median `|w - w_bak|`.", ""]
        for c in section["compensation"]:
            out += [f"**{c['label']}**" + (f" ({c['dataset']}, {c['model']})" if c.get("dataset") else ""), ""]
            head = ["tau", "n", "drift"] + [f"err {name}" for _, name in GUESSES] + \
                   [f"cos {name}" for _, name in GUESSES] + \
                   [f"{name} better" for key, name in GUESSES if key != "g"] + ["corr", "lam*"]
            out += ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
            for b in c["bins"]:
                low, high = b["tau"]
                cells = [str(low) if low == high else f"{low}-{high}", str(b["n"]), _f(b["drift"], ".3g")]
                cells += [_f(b.get(f"err_{k}"), ".4f") for k, _ in GUESSES]
                cells += [_f(b.get(f"cos_{k}"), ".4f") for k, _ in GUESSES]
                cells += [_f(b.get(f"better_{k}"), ".0%") for k, _ in GUESSES if k != "g"]
                cells += [_f(b.get("corr_h_gg")), _f(b.get("lam_fit"), ".3g")]
                out.append("| " + " | ".join(cells) + " |")
            out.append("")
        if "compensation" in plots:
            out += [f"![relative error and cosine against tau]({plots['compensation']})", ""]
    if section["alignment"]:
        out += ["### Alignment of updates (AGN's question)", "",
                "Mean cosine of each probed update (a commit, or `-lr*g` for a gradient rule) with minus the "
                "gradient of a fixed batch of 512 training samples at the weights the worker pulled (towards "
                "the minimum), and with the previous update applied by another worker; median update norm.", ""]
        head = ["group", "algorithm", "workers", "window", "probes", "tau mean", "cos towards minimum",
                "cos previous update", "update norm"]
        out += ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
        for a in section["alignment"]:
            cells = [a["label"], a["algo"], str(a["workers"]), "–" if a["window"] is None else str(a["window"]),
                     str(a["n"]), _f(a["tau_mean"], ".1f"), _f(a["cos_eval"]), _f(a["cos_prev"]),
                     _f(a["update_norm"], ".3g")]
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
        if "alignment" in plots:
            out += [f"![alignment against window and workers]({plots['alignment']})", ""]
    return out


def plot_probes(section: dict, out: Path) -> dict:
    """probes_compensation.png and probes_alignment.png, when there is something to draw."""
    from .report_plots import palette, pyplot
    plt = pyplot()
    made: dict = {}
    if plt is None:
        return made
    comp = section["compensation"]
    if comp:
        fig, axes = plt.subplots(2, len(comp), figsize=(4 * len(comp), 6), squeeze=False)
        for j, c in enumerate(comp):
            x = [(b["tau"][0] + b["tau"][1]) / 2 for b in c["bins"]]
            for i, kind in enumerate(("err", "cos")):
                ax = axes[i][j]
                for (key, name), color in zip(GUESSES, palette(plt, len(GUESSES))):
                    y = [b.get(f"{kind}_{key}") for b in c["bins"]]
                    if any(v is not None for v in y):
                        ax.plot(x, [math.nan if v is None else v for v in y], "o-", color=color, label=name)
                ax.set_xscale("symlog", linthresh=1)
                ax.set_xlabel("tau")
                ax.set_ylabel("median relative error" if kind == "err" else "median cosine with g_now")
                if i == 0:
                    ax.set_title(c["label"], fontsize=9)
            axes[0][0].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "probes_compensation.png", dpi=100)
        plt.close(fig)
        made["compensation"] = "probes_compensation.png"
    align = [a for a in section["alignment"]]
    if align:
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        lines: dict = {}
        for a in align:
            lines.setdefault((a["algo"], a["workers"]), []).append(a)
        for ((algo, workers), rows), color in zip(sorted(lines.items(), key=str), palette(plt, len(lines))):
            rows.sort(key=lambda r: r["window"] or 1)
            xs = [r["window"] or 1 for r in rows]
            for ax, key in zip(axes, ("cos_eval", "cos_prev")):
                ax.plot(xs, [math.nan if r[key] is None else r[key] for r in rows], "o-", color=color,
                        label=f"{algo} M={workers}")
        for ax, title in zip(axes, ("cosine with minus the fixed batch's gradient", "cosine with the previous update")):
            ax.set_xscale("log")
            ax.set_xlabel("window (1: single steps)")
            ax.set_title(title, fontsize=9)
        axes[0].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "probes_alignment.png", dpi=100)
        plt.close(fig)
        made["alignment"] = "probes_alignment.png"
    return made
