"""How far back gradients flow through the training sequences (the truncated-BPTT horizon), in words, for the
sequences section (``sequences.py``, whose :class:`~lstm_probe.report.sections.sequences.SequencesSection` the
functions here take): where episode starts inside the sequences cut it (:func:`judge_resets`), and a log whose
training stepped no optimizer (metadata ``optimizer_steps`` 0), whose sequences set no horizon, and a distillation log
without the count (:func:`no_claim`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from lstm_probe.report.section import fmt_steps

NO_STEP = "no optimizer step happened in training (the log's optimizer_steps is 0)"
"""Said where training stepped no optimizer: the gradients were never applied, so no horizon is stated."""
UNCOUNTED = (
    "the log does not count the optimizer steps training took (a distillation log without optimizer_steps: a run "
    "killed before its first update ended, or an older lstm-probe's)"
)
"""Said where a distillation log lacks the count: whether the gradients were applied is not known (rsl_rl steps none
where gradient_length exceeds an update's calls), so no horizon is stated."""


def no_claim(s: Any) -> str:
    """Why the sequences ``s`` set no horizon ('' where they do): no optimizer step, or a count the log lacks."""
    if s.optimizer_steps == 0:
        return NO_STEP
    return UNCOUNTED if getattr(s, "steps_uncounted", False) else ""


def unapplied_tail(meta: dict[str, Any]) -> int:
    """rsl_rl distillation: the student calls at each update's end whose gradients are never applied (0: none, or not
    a distillation log). ``Distillation.update`` counts its calls across the epochs and steps the optimizer after
    every ``gradient_length``-th; the loss of the calls after the last such step is dropped with the update, so
    where ``gradient_length`` does not divide epochs x steps per env, the remainder's calls never train."""
    hyper = meta.get("hyperparameters") if meta.get("algorithm") == "Distillation" else None
    if not isinstance(hyper, dict):
        return 0
    g, e, n = (hyper.get(k) for k in ("gradient_length", "num_learning_epochs", "num_steps_per_env"))
    if not all(isinstance(v, int) and v > 0 for v in (g, e, n)):
        return 0
    return int(e * n % g)  # type: ignore[operator]


def applied(places: np.ndarray, meta: dict[str, Any]) -> np.ndarray:
    """Which training sequences' gradients were applied, by their (epoch, first step in the epoch) ``places``
    (:func:`epoch_places`): not those in the update's never-applied tail (:func:`unapplied_tail`; rsl_rl's
    sequences are cut at each optimizer step, so a sequence lies wholly inside the tail or outside it)."""
    hyper = meta["hyperparameters"]
    total = hyper["num_learning_epochs"] * hyper["num_steps_per_env"]
    start = places[:, 0] * hyper["num_steps_per_env"] + places[:, 1]
    return np.asarray(~(start >= total - unapplied_tail(meta)))


def epoch_places(first: Any) -> np.ndarray:
    """Each training sequence's (epoch, first step in its epoch), from the sequences' first rows ``first`` (a
    :class:`~lstm_probe.report.scan.Frame`; a run of whole iterations): an epoch's minibatches (rsl_rl
    distillation's gradient windows) follow one another in minibatch order, each its sequences' ``seq_len`` long."""
    it, ep, mb, ln = (np.asarray(first[c], np.float64) for c in ("iteration", "epoch", "minibatch", "seq_len"))
    out = np.full((len(it), 2), np.nan)
    if not len(it):
        return out
    o = np.lexsort((mb, ep, it))
    i, e, m, n = it[o], ep[o], mb[o], ln[o]
    new_epoch = np.r_[True, (i[1:] != i[:-1]) | (e[1:] != e[:-1])]
    new_window = new_epoch | np.r_[True, m[1:] != m[:-1]]
    length = n[new_window]  # each window's (its first sequence's) length
    before = np.cumsum(length) - length  # the steps of the windows before it, over the whole run
    starts = new_epoch[new_window]
    offset = before - before[starts][np.cumsum(starts) - 1]  # ... in its own epoch
    out[o, 0], out[o, 1] = e, offset[np.cumsum(new_window) - 1]
    return out


CARRIED = {
    "carried_in_training": ("train", "the doctor finds the per-step training loop carrying it across episode starts"),
    "not_reset": ("rollout", "the doctor finds the rollout not resetting it at episode starts either"),
}
"""The doctor's problems (kind: its phase, and why in words) that say the state runs on across the episode starts
inside training sequences, and the gradient with it."""


def judge_resets(data: Any, problems: list[tuple[str, str]], train_resets: int = 0) -> None:
    """Whether the episode starts inside ``data``'s training sequences cut the gradient, from the doctor's
    ``problems`` (kind, phase): not where one of :data:`CARRIED` says the state runs on across them (the horizon is
    then the sequences' length), else they do (it is the stretches between them, as computed). A rollout that does
    not reset says nothing of training where the doctor saw the training loop reset (``train_resets``: the
    doctor's count). Nothing where no sequence holds one."""
    if not data.starts_inside:
        return
    carried = next((kind for kind, (phase, _) in CARRIED.items() if (kind, phase) in problems), None)
    if carried == "not_reset" and train_resets:
        carried = None
    data.cut_by_resets, data.carried_by = carried is None, carried
    if carried is not None and not no_claim(data):
        data.gradient_length = dict(data.length)


def horizon_in_words(s: Any, of: str) -> tuple[str, str]:
    """How far back gradients flow through the training sequences (``of``: whose), and why where the episode starts
    inside them do not cut it (said after the episode lengths; '' otherwise)."""
    g, n = s.gradient_length, s.length
    if s.optimizer_steps == 0:
        return f"{NO_STEP}: the gradients through the training sequences{of} were never applied, so no BPTT horizon", ""
    if no_claim(s):
        return (
            f"{UNCOUNTED}: whether the gradients through the training sequences{of} were applied is not known, so no "
            "BPTT horizon",
            "",
        )
    h = g or n  # the sequences whose gradients were applied (all but a distillation update's tail)
    whole = (
        f"gradients flow back at most {fmt_steps(h['max'])} steps (median {fmt_steps(h['median'])}) through the "
        f"training sequences{of}{tail_words(s)}"
    )
    if not s.starts_inside or not g:
        return whole, ""
    starts = _starts(s)
    if s.cut_by_resets is False:
        return f"{whole}, across {starts} inside them", f": the state is not reset there ({_why(s)})"
    steps = f"{fmt_steps(n['max'])} steps"
    if n["min"] != n["max"]:
        steps = f"up to {steps} (median {fmt_steps(n['median'])})"
    return (
        f"training sequences{of} are {steps}, but the state is reset at {starts} inside them, so gradients flow back "
        f"at most {fmt_steps(g['max'])} steps (median {fmt_steps(g['median'])}){tail_words(s)}",
        "",
    )


def tail_words(s: Any) -> str:
    """', leaving out ...' where the horizon leaves out each update's never-applied tail (:func:`unapplied_tail`)."""
    n = getattr(s, "unapplied_tail", None)
    if not n:
        return ""
    calls = "student call" if n == 1 else f"{n} student calls"
    return (
        f", leaving out each update's last {calls}, whose gradients rsl_rl never applies (gradient_length does not "
        "divide the update's calls: the loss after its last optimizer step is dropped)"
    )


def _starts(s: Any) -> str:
    """'the 24 episode starts' (inside the sequences), 'the one episode start'."""
    return "the one episode start" if s.starts_inside == 1 else f"the {s.starts_inside:,} episode starts"


def _why(s: Any) -> str:
    """Why the episode starts inside the sequences do not cut the gradient: the doctor's problem, in words."""
    return CARRIED.get(s.carried_by or "", ("", "the doctor finds the state carried across them"))[1]


def cuts_line(s: Any) -> str:
    """The panel's line on the episode starts inside the sequences ('' where none)."""
    if s.optimizer_steps == 0:
        return f"{NO_STEP}: the gradients were never applied, so there is no truncated-BPTT horizon\n"
    if no_claim(s):
        return f"{UNCOUNTED}: whether the gradients were applied is not known, so no truncated-BPTT horizon is stated\n"
    if not s.starts_inside:
        return ""
    starts = _starts(s)
    if s.cut_by_resets is False:
        verb = "does" if s.starts_inside == 1 else "do"
        return f"{starts} inside them {verb} not cut the gradient: the state is not reset there ({_why(s)})\n"
    g = s.gradient_length
    return (
        f"the state is reset at {starts} inside them, cutting the gradient: the stretches between them (the "
        f"truncated-BPTT horizon): min {fmt_steps(g.get('min'))}, median {fmt_steps(g.get('median'))}, "
        f"mean {fmt_steps(g.get('mean'))}, max {fmt_steps(g.get('max'))}\n"
    )
