"""How a run ends, as its log says: the lines trainers, launchers and trackers print when a run
ends well, the lines of a process's own exit path, and progress.

Why a module of its own: "the job failed" and "the job finished" are both claims, and the second
needs its own evidence (`outcome` turns it into `job.clean`, exit 0). Two strengths of evidence:

- an *end* line: the run's own words that it finished (a trainer's stop at its step or epoch
  limit, a final metrics block, Megatron's after-training line, torchrun's agent or a launcher
  reporting success, a tracker's successful final sync). After it, only a failure printed later
  makes the log a failure.
- an *exit* line: what a Python process prints on its way out when it ended on its own (PyTorch's
  ProcessGroupNCCL destructor warning at interpreter exit, multiprocessing's resource tracker at
  shutdown, a tracker's sync). It is printed after an exception too, so it says "not hung, not
  killed", never "succeeded": it makes a clean end only where no failure was seen at all.

Each pattern is written from its source's own message (named beside it).
"""

from __future__ import annotations

import re
from collections import deque
from typing import Any

from megatron_env.diagnose.joblog import Line
from megatron_env.diagnose.model import End, Events, rank_of

# what a trainer prints as it goes (Megatron, HF Trainer, Lightning/tqdm, DeepSpeed, plain)
PROGRESS = re.compile(r"\b(?:iteration|iter|global_step|step|Step|Epoch|epoch)[\s:=\[]*"
                      r"(?P<n>\d+)(?:\s*/\s*(?P<of>\d+))?")
ENDS = re.compile(
    # torch.distributed.elastic's agent, DeepSpeed's launcher, Kubeflow's PyTorchJob
    r"worker group successfully finished|WorkerState\.SUCCEEDED|exits successfully|"
    r"torchelastic\.worker\.status\.SUCCEEDED|Job '[\w-]+' succeeded|"
    # HF Trainer ("Training completed. Do not forget to share your model", its metrics dict,
    # the TrainOutput trainer.train() returns, run_*.py's "***** train metrics *****")
    r"Training completed|'train_runtime'|\bTrainOutput\(global_step=|\*+ train metrics \*+|"
    r"[Tt]raining (?:is )?(?:finished|complete|done)\b|[Ff]inished training|"
    # Lightning's stop at its limit; Megatron-LM's print_datetime and exit-interval lines
    r"`Trainer\.fit` stopped: `max_\w+=[\d:.]+` reached|\[after training is done\]|"
    r"exiting program at iteration|"
    # fairseq_cli/train.py ("done training in 123.4 seconds"), OpenNMT/ModernMT's "Train model
    # END 1234.5s", a trainer stopping at its limit ("Reached max_steps (1635), stopping
    # training."), plain scripts
    r"[Dd]one training\b|Train model END\b|[Rr]eached max[_ ](?:steps|epochs|iters?)\b.*stopping|"
    r"All done|"
    # srun's and a shell's exit status; wandb's finish when the run exited 0
    r"Exited with exit code 0\b|Process finished with exit code 0\b|"
    r"wandb: Waiting for W&B process to finish.*\(success\)|"
    # older wandb (< 0.10): its finish after the script exited 0 (wandb/wandb_run.py)
    r"wandb: Program ended successfully")
END_WORDS = ("successfully finished", "SUCCEEDED", "exits successfully", "Training completed",
             "raining is", "raining finished", "raining complete", "raining done", "stopped: `max_",
             "after training is done", "exiting program at", "train_runtime", "inished training",
             "succeeded", "Exited with exit code 0", "All done", "Done training", "done training",
             "TrainOutput(", "train metrics", "exit code 0", "(success)", "Train model END",
             "eached max", "Program ended successfully")
# a process's own way out (each printed at interpreter exit, whether the script raised or not)
EXITS = re.compile(
    # torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp, PyTorch >= 2.4, at the destructor
    r"process group has NOT been destroyed before (?:we destruct ProcessGroupNCCL|it is being "
    r"destructed)|"
    # multiprocessing/resource_tracker.py at shutdown
    r"resource_tracker: There appear to be \d+ leaked \w+ objects? to clean up at shutdown|"
    # wandb's finish: its sync and the link to the run
    r"wandb: Synced \d+ W&B file|wandb: (?:\S+ )?View run\b|wandb: Find logs at:")
EXIT_WORDS = ("has NOT been destroyed", "leaked", "wandb: Synced", "View run", "Find logs at")
# "Exception ignored in: <function X.__del__>": a destructor's error at teardown, printed and
# ignored by the interpreter (its traceback below, to its exception line, did not end anything)
IGNORED = "Exception ignored in"
IGNORED_SPAN = 40  # lines after it within which its exception line is looked for


def _end(ev: Events, line: Line, t: str, ahead: deque[Line], facts: dict[str, Any]) -> None:
    if ENDS.search(t):
        _keep(ev, End(line=t.strip(), seq=ev.lines, rank=rank_of(line)))


def _exit(ev: Events, line: Line, t: str, ahead: deque[Line], facts: dict[str, Any]) -> None:
    if EXITS.search(t):
        _keep(ev, End(line=t.strip(), seq=ev.lines, rank=rank_of(line), exit=True))


def _keep(ev: Events, end: End) -> None:
    """The first ends and always the last one (the one a clean end names)."""
    if len(ev.ends) < 64:
        ev.ends.append(end)
    else:
        ev.ends[-1] = end


def _ignored(ev: Events, line: Line, t: str, ahead: deque[Line], facts: dict[str, Any]) -> None:
    facts["ignored"] = line.number


def ignored(facts: dict[str, Any], line: Line, exception: bool) -> bool:
    """Is this failure-looking line part of an exception the interpreter ignored? Its
    traceback ends at the first exception line after the heading, which closes it."""
    at = facts.get("ignored")
    if at is None or not 0 <= line.number - at <= IGNORED_SPAN:
        return False
    if exception:
        facts["ignored"] = None
    return True


READERS = [*((w, _end) for w in END_WORDS), *((w, _exit) for w in EXIT_WORDS),
           (IGNORED, _ignored)]


_LAST_RANKS = 50  # lines at the end of a log whose ranks are "still printing"
# a row of a final metrics block ("  epoch                    =        3.0"): a summary of the
# run, not progress after its end
_METRIC_ROW = re.compile(r"^\s*[\w/.-]+\s*=\s*\S+\s*$")
# what a trainer prints after its end line about the same run, not progress of another one:
# Megatron-LM's final evaluation (training.py's evaluate_and_print_results, "validation loss at
# iteration N on validation set" / "... on test set") and checkpoint (checkpointing.py)
_AFTER_END = re.compile(r"validation loss at iteration|saving checkpoint at iteration|"
                        r"successfully saved checkpoint from iteration")


def end_state(tail: list[str], source: str = "-") -> dict[str, Any]:
    """How a log ends, from its last lines: the last time and progress printed, the ranks
    printing in its last lines, its last line, and whether progress followed a normal end."""
    from megatron_env.diagnose import joblog
    from megatron_env.diagnose.model import stamp

    lines = [x for x in joblog.lines(list(tail), source) if x.text.strip()]
    out: dict[str, Any] = {"time": None, "iteration": None, "ranks": [], "last": "",
                           "progress_after_end": False}
    if not lines:
        return out
    out["last"] = lines[-1].text.strip()
    out["ranks"] = sorted({x.rank for x in lines[-_LAST_RANKS:] if x.rank is not None})
    ended = False
    for x in lines:
        if ENDS.search(x.text) or EXITS.search(x.text):
            ended, out["progress_after_end"] = True, False
        elif (ended and PROGRESS.search(x.text) and not _METRIC_ROW.match(x.text)
              and not _AFTER_END.search(x.text)):
            out["progress_after_end"] = True
    for x in reversed(lines):
        if out["time"] is None and (t := stamp(x.text)):
            out["time"] = t
        if out["iteration"] is None and PROGRESS.search(x.text) and not _METRIC_ROW.match(
                x.text):
            out["iteration"] = x.text.strip()
        if out["time"] and out["iteration"]:
            break
    return out
