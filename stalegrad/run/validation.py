"""The validation split of one run (``val_split``): what ``train`` holds out, what each evaluation adds.

The split itself is ``data/split.py`` (a fixed seed, the same samples in every run of a data set). A run
with a split trains only on the rest: the epoch budget, the shards and the mini-batches count the
remaining samples (config.json's ``train_samples``), and each evaluation adds ``val_loss`` and ``val_acc``
beside ``test_loss`` and ``test_acc``; summary.json adds ``final_val_acc``, ``best_val_acc`` and
``final_val_loss``. A run without one (``val_split`` 0, the default) is exactly what it was before:
the same files, the same bits (tests/test_selection.py).
"""
from __future__ import annotations

from ..data.split import VAL_SPLIT_SEED, holdout
from ..errors import ConfigError


def split_run(config, train_data, module, runtime) -> tuple[object, object | None, dict]:
    """(training part, validation part or None, what config.json records of the split)."""
    held = config.val_samples(len(train_data.y))
    if not held:
        return train_data, None, {}
    name = runtime.describe().get("name")
    if name == "local" and any(True for _ in module.buffers()):
        raise ConfigError("val_split", "with runtime local needs a model without BatchNorm statistics: its server "
                                       "process, which evaluates the validation set, does not see the workers' "
                                       "statistics; use runtime sim or ray, or a model without BatchNorm")
    train_part, val_part = holdout(train_data, held)
    return train_part, val_part, {"val_samples": held, "val_split_seed": VAL_SPLIT_SEED}


def evaluate_val(model, w, val_data, record: dict) -> None:
    """Add ``val_loss`` and ``val_acc`` of weights ``w`` to ``record`` (in this process: the validation
    set is evaluated with the very weights whose snapshot goes to the test evaluation)."""
    record["val_loss"], record["val_acc"] = model.evaluate(w, val_data.x, val_data.y)


def summary_figures(metrics: list[dict]) -> dict:
    """summary.json's validation figures (none for a run without a split)."""
    if not metrics or "val_acc" not in metrics[-1]:
        return {}
    return {"final_val_acc": metrics[-1]["val_acc"], "best_val_acc": max(m["val_acc"] for m in metrics),
            "final_val_loss": metrics[-1]["val_loss"]}
