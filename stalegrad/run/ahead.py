"""``TrainingRun.ahead``: what the next messages will meet, for a runtime that lets its workers push
without asking it each time (the Ray runtime's direct path, ``runtimes/ray/direct.py``)."""
from __future__ import annotations


def plan_ahead(run, samples: int, messages: int) -> dict:
    """For the next ``messages`` messages of ``samples`` samples each, counted one after another from now:
    "lr", the rate each is pushed with (a worker that starts after message k computes with entry k + 1);
    "evaluate", the k after whose ``after_push`` an evaluation is due; "last", the k whose message spends
    the budget (None: none of them); "checkpoint", the server version at which the next checkpoint is due
    (None: the run writes none). The same values ``lr``, ``evaluation_due``, ``done_after`` and
    ``checkpoint_due`` give as the messages are counted, without counting them."""
    lrs, evaluate, last, next_eval = [], [], None, run._next_eval
    for k in range(messages):
        before, after = run.samples + k * samples, run.samples + (k + 1) * samples
        lrs.append(run.schedule(before / run.num_samples))
        if next_eval <= after < run.sample_budget:   # evaluation_due, and evaluate's next interval
            evaluate.append(k)
            while next_eval <= after:
                next_eval += run.eval_interval
        if last is None and after >= run.sample_budget:
            last = k
    return {"lr": lrs, "evaluate": evaluate, "last": last,
            "checkpoint": run._next_checkpoint if run.checkpoint_path is not None else None}
