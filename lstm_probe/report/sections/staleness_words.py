"""The staleness section's words where rows are missing: why no provenance check was made, and which
minibatches the drifts of a log that keeps some envs' rows come from."""

from __future__ import annotations


def indices(values: list[int], per_epoch: int | None) -> str:
    """'minibatches 1 and 3 of 4 per epoch'."""
    words = [str(v) for v in values]
    listed = words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"
    of = f" of {per_epoch} per epoch" if per_epoch else ""
    return f"minibatch{'es' if len(words) > 1 else ''} {listed}{of}"


def provenance_note(tagged: int, kept: int | None, first_epoch: list[int], per_epoch: int | None) -> str:
    """Why no train row could be checked against its rollout state before the first optimizer step
    (``first_epoch``: the minibatches of epoch 0 with drift rows)."""
    if not tagged:
        return (
            "no train row with a drift is tagged with its epoch and minibatch, so none is known to come before the "
            "first optimizer step (tag the train calls with epoch and minibatch)"
        )
    if kept is not None:
        fell = f"; in epoch 0 they fell in {indices(first_epoch, per_epoch)}" if first_epoch else ""
        return (
            f"envs 0..{kept - 1}, the only envs with rows in this log (--trace-envs {kept} --other-envs none), were "
            f"in no update's first minibatch (epoch 0, minibatch 0: the only one before any optimizer step{fell}); "
            "--other-envs summary keeps every env's rows and checks every env"
        )
    return (
        "no train row tagged epoch 0 and minibatch 0 (the minibatch before any optimizer step; epochs and "
        "minibatches count from 0) was paired with the rollout state of its env step"
    )


def drift_from(kept: int, seen: list[int], per_epoch: int | None, held: int, held_epochs: int) -> str:
    """Which minibatches the drifts come from in a log that keeps only some envs' rows."""
    if len(seen) == 1:
        which = f"minibatch {seen[0]}{f' (of {per_epoch})' if per_epoch else ''} of each epoch only"
        if seen[0] == 0:
            which += " (epoch 0's is the minibatch before any optimizer step: its drift is the provenance check's)"
    elif not seen:
        which = "the minibatches that held them"
    elif held and held == held_epochs:
        which = f"one minibatch of each epoch, whichever held them ({indices(seen, per_epoch)})"
    elif held and per_epoch:
        which = (
            f"the {held:,} of the {held_epochs * per_epoch:,} minibatches of their "
            f"{held_epochs:,} epochs that held them (which ones changed from epoch to epoch: "
            f"{indices(seen, per_epoch)})"
        )
    else:
        which = f"the minibatches that held them ({indices(seen, per_epoch)})"
    return (
        f"this log keeps the rows of envs 0..{kept - 1} alone (--trace-envs {kept} --other-envs none): these "
        f"drifts come from {which}, not from every minibatch; --other-envs summary keeps every env's drift"
    )
