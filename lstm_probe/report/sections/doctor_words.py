"""What the doctor's table says where the doctor names no problem (``report/sections/doctor.py``): the line
under it, true of every column it shows. A column that started from 'previous', 'reset' or 'stored' needs no
word; the others ('zero', 'other': ``capture/inputs.py`` says what each answer means) are no bug the doctor can
name where it names none, and the line says why, column kind by column kind. And the words a problem gains from
what the per-step training loop showed (:func:`rollout_alone`)."""

from __future__ import annotations

from typing import Any

from lstm_probe.report.sections.doctor_rows import TRAINING, First

PLACED = ("previous", "reset", "stored")
"""Sources the "no problem found" line names without a word on them."""


def clean_line(
    sources: dict[str, dict[str, int]],
    entered: dict[str, int],
    inside: dict[str, int],
    kept: str,
    rolled: dict[str, int] | None = None,
    zeroed: dict[str, int] | None = None,
    train_other: dict[str, dict[str, int]] | None = None,
    start: str | None = None,
) -> str:
    """The line under a table that shows no problem (``sources``: 'module/phase' -> init value -> columns):
    what its columns other than previous, reset and stored mean there, and why the doctor names no problem for
    them (``doctor._problems``). ``entered``, ``inside``: per 'module/phase', the 'other' columns at the first
    call of their env column in the phase's group, and at a later one; ``kept``: the env columns the log keeps
    rows of where it keeps only some ('' where every column has rows); ``rolled``: per 'module/phase', the 'other'
    columns at a rollout's first step that the log's integration declares by design (:func:`rollout_lines` says
    them, not this line); ``zeroed``: per 'module/phase', the 'zero' columns at a rollout's first step of a module
    the integration declares zeroed there (:func:`zeroed_lines` says them); ``train_other``: per training
    'module/phase', its 'other' columns by their sequences' start reason (``start``: ``Capabilities.rollout_start``)."""
    rolled, zeroed, train_other = rolled or {}, zeroed or {}, train_other or {}
    of = f" (of {kept}: the log keeps no other rows)" if kept else ""
    parts: list[str] = []
    for key, values in sources.items():
        phase = key.rpartition("/")[2]
        for value, n in values.items():
            # rollout_lines and zeroed_lines say those of the framework's design
            by_design = {"other": rolled, "zero": zeroed}.get(value, {}).get(key, 0)
            n -= by_design
            if value == "other" and phase in TRAINING and n > 0:
                for said, words in _training_starts(key, train_other.get(key, {}), start):
                    parts.append(words)
                    n -= said
            if n > 0 and value not in PLACED:
                parts.append(_unplaced(key, phase, value, n, entered.get(key, 0), inside.get(key, 0) - by_design))
    if not parts:
        return f"no problem found: every call started from its previous state, a reset or a stored state{of}"
    return (
        f"no problem found{of}. Calls that started from neither their previous state, a reset nor a stored state: "
        + "; ".join(parts)
    )


def _training_starts(key: str, reasons: dict[str, int], start: str | None) -> list[tuple[int, str]]:
    """The 'other' starts of ``key``'s training sequences (``reasons``: by the sequence's start reason) whose reason
    says where their state came from, each as (count, words): a gradient window's first step, and where the log
    declares a rollout's start (``start``) a sequence that begins at its env's first rollout step."""
    said = {
        "gradient_window": (
            "at a gradient window's first step, from the state their pass's previous step left (detached there: the "
            "previous window's optimizer step came at that step), which is not the stored rollout state once the "
            "weights have changed: truncated BPTT within one pass, no bug"
        )
    }
    if start:
        said["env_boundary"] = (
            "at their env's first rollout step from the state that rollout began from, which by the framework's design "
            "(its integration declares it) is not the state the previous rollout's last step left, the stored state "
            "the doctor compares with: no provenance bug"
        )
    return [(n, f"{n:,} {key} sequences started {said[r]}") for r, n in reasons.items() if n and r in said]


def _unplaced(key: str, phase: str, value: str, n: int, first: int, later: int) -> str:
    """Why ``n`` columns of ``key`` that started from ``value`` (not previous, reset or stored) are no problem the
    doctor names, where it names none (``first``, ``later``: of 'other' columns, at their env column's first
    call in the phase's group and at a later one)."""
    if value == "other" and phase in TRAINING:
        return (
            f"{n:,} {key} sequences started from a state that is not bit-equal to their env's stored rollout state "
            "(or one the probe did not hold): the doctor names no bug from that"
        )
    if value == "zero" and phase in TRAINING:
        return f"{n:,} {key} sequences started from zeros, and the rollout never carried its state from step to step"
    if value == "zero":
        return (
            f"{n:,} {key} columns started from zeros where no tag says whether an episode started (see the note "
            "on episode starts)"
        )
    if value == "other" and phase == "other":
        return f"{n:,} {key} columns started from a state the doctor cannot place (see the note on calls without phase)"
    if value != "other":
        return f"{n:,} {key} columns started from '{value}'"
    text = (
        f"{n:,} {key} columns ('other') started from a state the doctor cannot place (not zeros, not the state the "
        "module last returned for that env column in that phase, not a stored one, not another column's), none at "
        "a tagged episode start (there it names a state not reset)"
    )
    said = []
    if first:
        said.append(
            f"{first:,} at the first {phase} call of their env column (after calls in another phase, or none): a "
            "state brought in from elsewhere, e.g. a play loop going on from the state the rollout left, which is "
            "right while the env's episode goes on"
        )
    if later:
        said.append(
            f"{later:,} at a later {phase} call: the state changed between two calls of its env column outside the "
            "module's step as the probe saw it (dropout the probe's re-run leaves out, noise, an edited state), "
            "which the doctor cannot tell from a bug"
        )
    if n - first - later > 0:
        said.append(f"{n - first - later:,} with no env or env step to tell where they came from")
    return text + (": " + ", ".join(said) if said else "")


ROLLOUT_STARTS = {
    "training": (
        "the state training's last pass over the previous rollout ended with (the student's module keeps it after the "
        "update, and the next update's epochs start from it too), not the one the previous rollout's last step left"
    )
}
"""``Capabilities.rollout_start`` -> what a rollout's first step starts from by its framework's design."""

OUTPUTS = {"targets": "the training targets another module learns to copy"}
"""``Capabilities.rollout_zeroed``'s values -> what the module's outputs are."""


def zeroed_lines(zeroed: dict[str, int], declared: dict[str, str]) -> list[str]:
    """The doctor's words on the 'zero' starts at a rollout's first step (``zeroed``: per 'module/phase') of the
    modules the log's integration declares zeroed at every rollout's start (``declared``: module -> what its
    outputs are, ``Capabilities.rollout_zeroed``): the framework's design, with its consequence."""
    out = []
    for key, n in zeroed.items():
        module = key.rpartition("/")[0]
        what = OUTPUTS.get(declared.get(module, ""), f"'{declared.get(module)}', as this log's integration declares")
        out.append(
            f"{n:,} {key} columns started their rollout's first step from zeros while their episodes went on: the "
            f"framework zeroes the {module} module's state at every rollout's start (its integration declares it), so "
            f"until each env's next episode start its outputs ({what}) are computed without the episode so far, and "
            f"differ from those of a state kept from step to step wherever the module uses its memory"
        )
    return out


def rollout_lines(rolled: dict[str, int], start: str | None) -> list[str]:
    """The doctor's words on the 'other' starts at a rollout's first step (``rolled``: per 'module/phase') where the
    log's integration declares where a rollout starts from (``start``: ``Capabilities.rollout_start``)."""
    if not start:
        return []
    what = ROLLOUT_STARTS.get(start, f"'{start}', as this log's integration declares")
    return [
        f"{n:,} {key} columns started their rollout's first step from {what}: the framework's design (its "
        "integration declares it), no provenance bug"
        for key, n in rolled.items()
        if n
    ]


def rollout_alone(text: str, inside: int, reset: int, checked: int) -> str:
    """The rollout's not-reset problem ``text`` saying that the per-step training loop does reset the state there:
    ``inside`` of those episode starts lie inside the run's training sequences, and at ``reset`` of the ``checked``
    among them in first-minibatch sequences (before any optimizer step) its states depart from the rollout's: the
    rollout alone is at fault."""
    starts = "that episode start lies" if inside == 1 else f"{inside:,} of those episode starts lie"
    seen = f"all {checked:,}" if reset == checked else f"{reset:,} of the {checked:,}"
    seen = "the one" if checked == 1 and reset == 1 else seen
    clause = (
        f"; the per-step training loop does reset it: {starts} inside training sequences, and at {seen} of them it "
        "can check (in each iteration's first minibatch, before any optimizer step; later ones cannot be, the weights "
        "have moved) its states depart from the rollout's there, so the rollout alone is at fault and the provenance "
        "check fails there"
    )
    return text.replace("; first at ", f"{clause}; first at ", 1)


def global_step(stride: int, first: First, where: str) -> str:
    """The problem line of a rollout whose ``env_step`` advances by ``stride`` > 1 at every counted step
    (``doctor_rows.Strides``): a global counter tagged as each env's step, and the fix."""
    return (
        f"the rollout's env_step advances by {stride} at every step of an env ({first.count:,} times, never by 1): "
        f"a global counter (CleanRL's global_step, which advances by the number of envs each step), not each env's "
        f"own step: episode lengths read from it come out {stride}x too long, and training's stored start states "
        f"are sought at the wrong step (counted 'other'); tag each env's own step counter (env_step=first + step "
        f"of the rollout loop, first = iteration * num_steps; the same counter on the bootstrap and train calls), "
        f"not global_step; first at {where}"
    )


def global_pairing(stride: int) -> str:
    """What the provenance check compared where the rollout's env_step advances by ``stride`` > 1 a step (the doctor's
    global_env_step): the words said after its verdict."""
    return (
        f"its pairs are matched by env_step, which here advances by {stride} a step (a global counter: see the "
        "doctor), so they are the same steps only because the train calls carry the same counter as the rollout; "
        "what is counted from env steps (episode lengths, the stored start states the doctor seeks at the step "
        "before a sequence's first) is off until each env's own step is tagged"
    )


def paths_fact(paths: dict[str, Any]) -> tuple[float | None, str]:
    """sb3's ``minibatch_paths`` metadata: the share of the measured training time its per-step path took, and the
    doctor's fact that says it ('' where no minibatch was measured)."""

    def get(path: str, what: str) -> float:
        v = (paths.get(path) or {}).get(what)
        return float(v) if isinstance(v, int | float) else 0.0

    slow, fast = get("stepwise", "minibatches"), get("sequence", "minibatches")
    secs_slow, secs = get("stepwise", "seconds"), get("stepwise", "seconds") + get("sequence", "seconds")
    if not slow + fast:
        return None, ""
    share = secs_slow / secs if secs > 0 else None
    words = f"{100 * share:.0f}%" if share is not None else "-"
    return share, (
        f"{int(slow)} of {int(slow + fast)} minibatches held an episode start and ran sb3-contrib's per-step "
        f"path (one LSTM call per step: every minibatch with an episode start does; sb3-contrib #113); they "
        f"took {words} of the training time the probe measured ({secs_slow:.2f} s of {secs:.2f} s)"
    )


SAME_STEP = (
    "the vector env autoresets in SAME_STEP mode (the log's autoreset_mode): the step that ends an episode returns the "
    "next episode's first observation (the terminal one in infos['final_obs']), so a state reset on the done flags "
    "falls on each episode's first observation and every step trained on is a real transition"
)
NEXT_STEP = (
    "the vector env autoresets in NEXT_STEP mode (the log's autoreset_mode; gymnasium >= 1.1's default): the step "
    "after an episode's end returns the reset observation with reward 0 and no termination, and ignores the action"
)
NEXT_STEP_FIX = (
    "make the env SAME_STEP (gym.vector.SyncVectorEnv(..., autoreset_mode=gym.vector.AutoresetMode.SAME_STEP): the "
    "step that ends an episode then returns the next one's first observation, the terminal one in "
    "infos['final_obs']), or mask the autoreset steps (leave them out of the loss and the advantages, and reset the "
    "state at the step after them)"
)


def autoreset_words(mode: str | None, count: int, where: str) -> tuple[str, str]:
    """What the vector env's autoreset ``mode`` (the log's ``autoreset_mode``: gymnasium's 'NextStep', 'SameStep' or
    'Disabled') means for the state resets and the training data, as (problem, fact): a NEXT_STEP env whose rollout
    has ``count`` episode starts tagged past an env's first step (the first at ``where``) is a problem; the rest a
    fact ('' where the log has no mode)."""
    if mode == "NextStep" and count:
        starts = "episode start" if count == 1 else f"{count:,} episode starts"
        return (
            f"{NEXT_STEP}. So the {starts} tagged in the rollout (the done flags of the step before, CleanRL's "
            "next_done) fall on steps whose observation is the ended episode's terminal one: the state is reset there, "
            "not at the new episode's first observation, which meets a state that has already seen the old episode's "
            "last one; and each is a transition whose action did nothing (reward 0) that the loop still trains on (in "
            "CleanRL's GAE its value target is the next episode's first value), while the episode lengths counted "
            "from these starts come out one step longer than the env's, after each env's first (Tracer.rewards "
            f"leaves the autoreset steps out). Fix: {NEXT_STEP_FIX}; first at {where}",
            "",
        )
    if mode == "NextStep":
        return "", (
            f"{NEXT_STEP}: a loop that resets its state on the done flags resets it on each ended episode's terminal "
            "observation and trains on one no-op step per episode (no rollout episode start is tagged here to count "
            f"them); {NEXT_STEP_FIX}"
        )
    if mode == "SameStep":
        return "", SAME_STEP
    if mode == "Disabled":
        return "", (
            "the vector env does not autoreset (DISABLED, the log's autoreset_mode): the loop resets ended envs "
            "itself, and the doctor checks the state resets at the episode starts it tags"
        )
    return "", ""


AUTORESET_NOTE = (
    "the vector env's autoreset mode: under gymnasium >= 1.1's default (NEXT_STEP) the rollout steps tagged as "
    "episode starts here would be no-op steps on each ended episode's terminal observation; pass envs= to "
    "lstm_probe.trace (the vector env) for the doctor to say"
)
