"""Plug the cycle-cost depth controller into upstream SGLang 0.5.23's adaptive speculation (issue 7).

Upstream (``--speculative-adaptive``, EAGLE / EAGLE3 with ``topk=1``, the path MTP drafts
such as Kimi K3's and Qwen3.8-Flash-Next's run on) builds one runtime state (draft and
verify graphs / buffers) per candidate depth and asks a *policy* object, through
``AdaptiveController``, which depth to run:

* ``get_steps_for_batch(batch_size)`` before each decode step (``activate_step_by_batch``);
* ``on_verify_complete(num_correct_drafts_per_req, batch_size)`` once accept lengths are on CPU;
* ``candidate_steps`` / ``set_cuda_graph_bs`` / ``cuda_graph_bs_for_step`` when the states are built.

Upstream's policy is ``AdaptiveSpeculativeParams`` (an EMA of the accept length, per
batch-size slot). We keep upstream's controller and worker and swap the policy object:

=============================================================  ==========  ===============================================
upstream target                                                hook        what it does
=============================================================  ==========  ===============================================
``ServerArgs.add_cli_args``                                    AFTER       adds ``--speculative-depth-controller``
``ServerArgs.from_cli_args``                                   AFTER       keeps the choice on the record (pickled along)
``EAGLEWorkerV2.__init__``                                     AFTER       replaces ``adaptive_controller.params``
``EAGLEWorkerV2.forward_batch_generation``                     AROUND      request ids of a decode batch; timer mark
                                                                           at a non-decode step
``eagle_utils.verify_tree_greedy_func``                        AROUND      benchmark-only controlled acceptance
                                                                           (``controlled_acceptance.py``; off unless
                                                                           ``--speculative-synthetic-acceptance``)
=============================================================  ==========  ===============================================

``--speculative-depth-controller``: ``fixed`` (stay at ``--speculative-num-steps``),
``ema`` (upstream's policy, unchanged), ``cycle-cost`` (ours). Unset: ``cycle-cost`` when the
target architecture is one of ours (:data:`OUR_ARCHITECTURES`), ``ema`` otherwise. The
environment variable ``SGLANG_HYBRID_SPEC_DEPTH_CONTROLLER`` sets it for the Python
``Engine`` API. The flag acts only with ``--speculative-adaptive`` (without it upstream
builds no per-depth states and there is nothing to choose among). NGRAM and the other
workers have no adaptive controller upstream; the flag is ignored there (logged).
"""

from __future__ import annotations

from sglang_hybrid.flags import add_plugin_argument

import logging
import os
import time
from collections import deque
from typing import Deque, Dict, Hashable, List, Optional, Sequence, Tuple

from sglang_hybrid.patches import register_patches

from . import controlled_acceptance
from .controller import DepthController
from .cycle_cost import CycleTimer, batch_bucket

logger = logging.getLogger("sglang_hybrid.speculative")

CHOICES = ("fixed", "ema", "cycle-cost")
FLAG = "--speculative-depth-controller"
ENV = "SGLANG_HYBRID_SPEC_DEPTH_CONTROLLER"
#: Seconds between two ``spec depth controller:`` log lines of the cycle-cost policy (default 60; <= 0: none).
LOG_INTERVAL_ENV = "SGLANG_HYBRID_SPEC_DEPTH_LOG_INTERVAL_S"
#: Bookkeeping attribute on upstream's ``ServerArgs`` (underscore names survive pickling to the scheduler).
SERVER_ARGS_ATTR = "_sglang_hybrid_depth_controller"
#: Target architectures that default to ``cycle-cost``: Kimi K3 and Qwen3.8-Flash-Next (upstream ``qwen4_exp``).
OUR_ARCHITECTURES = frozenset({"KimiK3LinearForCausalLM", "Qwen4ExpForConditionalGeneration", "Qwen4ExpForCausalLM"})


def _check_choice(value: str, name: str) -> str:
    if value not in CHOICES:
        raise ValueError(f"{name} must be one of {list(CHOICES)}, got {value!r}")
    return value


def resolve_controller_choice(server_args, architectures: Sequence[str]) -> Tuple[str, str]:
    """``(choice, why)``: the flag on ``server_args``, else ``$SGLANG_HYBRID_SPEC_DEPTH_CONTROLLER``,
    else ``cycle-cost`` for :data:`OUR_ARCHITECTURES` and ``ema`` otherwise.

    Raises:
        ValueError: a value outside ``fixed``, ``ema``, ``cycle-cost``.
    """
    value = getattr(server_args, SERVER_ARGS_ATTR, None)
    if value:
        return _check_choice(value, FLAG), f"{FLAG} {value}"
    value = os.environ.get(ENV)
    if value:
        return _check_choice(value, ENV), f"{ENV}={value}"
    ours = sorted(set(architectures) & OUR_ARCHITECTURES)
    if ours:
        return "cycle-cost", f"default for {ours[0]}"
    return "ema", "default for architectures other than ours (upstream's policy)"


def _initial_depth(initial_steps: int, steps: List[int]) -> int:
    # Same fallback as upstream when --speculative-num-steps is not a candidate: the middle one.
    return initial_steps if initial_steps in steps else steps[len(steps) // 2]


class FixedDepthPolicy:
    """Upstream's ``AdaptiveSpecPolicy`` protocol at one depth: ``--speculative-num-steps`` (A/B baseline)."""

    name = "fixed"

    def __init__(self, initial_steps: int, candidate_steps: Sequence[int]):
        self.depth = _initial_depth(initial_steps, sorted(set(candidate_steps)))
        self._cuda_graph_bs: Optional[List[int]] = None

    @property
    def candidate_steps(self) -> List[int]:
        return [self.depth]

    def set_cuda_graph_bs(self, cuda_graph_bs: Optional[List[int]]) -> None:
        self._cuda_graph_bs = sorted(cuda_graph_bs) if cuda_graph_bs else None

    def cuda_graph_bs_for_step(self, step: int) -> Optional[List[int]]:
        return None if self._cuda_graph_bs is None else list(self._cuda_graph_bs)

    def get_steps_for_batch(self, batch_size: int) -> int:
        return self.depth

    def on_verify_complete(self, num_correct_drafts_per_req: List[int], batch_size: int) -> Optional[int]:
        return None

    def metrics(self) -> dict:
        return {"policy": self.name, "depth": self.depth}


class CycleCostDepthPolicy:
    """Upstream's ``AdaptiveSpecPolicy`` protocol backed by :class:`DepthController`.

    Every candidate depth is available at every CUDA-graph batch size (upstream's default
    config prunes large batch sizes to depth 0; here the controller decides from measured
    cost, so all states are captured — more graph memory than upstream's EMA default).

    Args:
        initial_steps: ``--speculative-num-steps`` (used until the first decision).
        candidate_steps: depths whose states exist (upstream's config union, which sized the buffers).
        controller: a :class:`DepthController` (default: one over ``candidate_steps``).
        timer: a :class:`CycleTimer` (default: device events when ``use_device_events``, else wall clock).
        log_interval_s: seconds between two log lines (``<= 0``: never).
        warmup_cycles: cycles not recorded at the start of each ``(depth, batch bucket)`` cell: the
            first decode of a process, and the first cycles at a depth or batch size, carry one-time
            work (the CPU server's first decode took 14.9 s against ~30-60 ms after it, 2026-12-03)
            that would otherwise be charged to whichever depth ran it.
    """

    name = "cycle-cost"

    def __init__(
        self,
        initial_steps: int,
        candidate_steps: Sequence[int],
        *,
        controller: Optional[DepthController] = None,
        timer: Optional[CycleTimer] = None,
        use_device_events: bool = False,
        log_interval_s: float = 60.0,
        clock=time.monotonic,
        warmup_cycles: int = 1,
    ):
        steps = sorted(set(int(s) for s in candidate_steps))
        self.controller = controller if controller is not None else DepthController(steps)
        if self.controller.depths != steps:
            raise ValueError(f"controller depths {self.controller.depths} differ from candidate_steps {steps}")
        self.timer = timer if timer is not None else CycleTimer(use_device_events=use_device_events)
        self._steps = steps
        self._cuda_graph_bs: Optional[List[int]] = None
        self._launched: Deque[Tuple[int, int, Optional[List[Hashable]]]] = deque(maxlen=64)
        self._next_request_ids: Optional[List[Hashable]] = None
        self._last_depth = _initial_depth(initial_steps, steps)
        self._log_interval_s = log_interval_s
        self._clock = clock
        self._last_log = clock()
        self.unmatched_verifies = 0
        if not (isinstance(warmup_cycles, int) and warmup_cycles >= 0):
            raise ValueError(f"warmup_cycles must be an int >= 0, got {warmup_cycles!r}")
        self.warmup_cycles = warmup_cycles
        self._warmup_seen: Dict[Tuple[int, int], int] = {}
        self.warmup_skipped = 0

    # -- upstream's AdaptiveSpecPolicy protocol --
    @property
    def candidate_steps(self) -> List[int]:
        return list(self._steps)

    def set_cuda_graph_bs(self, cuda_graph_bs: Optional[List[int]]) -> None:
        self._cuda_graph_bs = sorted(cuda_graph_bs) if cuda_graph_bs else None

    def cuda_graph_bs_for_step(self, step: int) -> Optional[List[int]]:
        return None if self._cuda_graph_bs is None else list(self._cuda_graph_bs)

    def get_steps_for_batch(self, batch_size: int) -> int:
        """Decide the depth of the decode step about to start, and mark the cycle timer."""
        if batch_size < 1:  # idle batch (attention DP): nothing runs
            return self._last_depth
        ids = self._next_request_ids
        self._next_request_ids = None
        if ids is not None and len(ids) != batch_size:
            ids = None
        depth = self.controller.choose_depth(batch_size, ids)
        self.timer.mark((depth, batch_size))
        self._launched.append((depth, batch_size, ids))
        self._last_depth = depth
        return depth

    def on_verify_complete(self, num_correct_drafts_per_req: List[int], batch_size: int) -> Optional[int]:
        """Feed accept lengths and finished cycle timings; the decision waits for the next batch (returns None)."""
        for (depth, bs), seconds in self.timer.collect():
            cell = (depth, batch_bucket(bs))
            seen = self._warmup_seen.get(cell, 0)
            if seen < self.warmup_cycles:
                self._warmup_seen[cell] = seen + 1
                self.warmup_skipped += 1
                continue
            self.controller.record_cycle_cost(depth, bs, seconds)
        n = len(num_correct_drafts_per_req)
        # With the overlap scheduler the next step is launched before this result arrives:
        # match results to launches in order, by batch size.
        launch = None
        while self._launched:
            candidate = self._launched.popleft()
            if candidate[1] == n:
                launch = candidate
                break
        if launch is None or (n and max(num_correct_drafts_per_req) > launch[0]):
            self.unmatched_verifies += 1
            logger.debug("spec depth controller: verify result of %d requests matched no launch; skipped", n)
        else:
            self.controller.observe(num_correct_drafts_per_req, launch[0], launch[2])
        if self._log_interval_s > 0 and self._clock() - self._last_log >= self._log_interval_s:
            self._last_log = self._clock()
            logger.info("%s", self.controller.format_log_line())
        return None

    # -- called by our forward hook --
    def set_next_request_ids(self, request_ids: Sequence[Hashable]) -> None:
        self._next_request_ids = list(request_ids)

    def mark_non_decode_step(self) -> None:
        self.timer.mark(None)

    def metrics(self) -> dict:
        """Chosen-depth histogram, estimated acceptance curve, measured cycle costs (JSON-ready)."""
        out = {"policy": self.name, "timer": "device-events" if self.timer.uses_device_events else "wall-clock"}
        out.update(self.controller.metrics())
        out["unmatched_verifies"] = self.unmatched_verifies
        out["warmup_cycles_skipped"] = self.warmup_skipped
        return out


def make_policy(choice: str, initial_steps: int, candidate_steps: Sequence[int], *, use_device_events: bool = False):
    """Policy object for ``choice`` (``fixed`` / ``cycle-cost``); ``ema`` is upstream's own and returns ``None``."""
    _check_choice(choice, "choice")
    if choice == "fixed":
        return FixedDepthPolicy(initial_steps, candidate_steps)
    if choice == "cycle-cost":
        interval = float(os.environ.get(LOG_INTERVAL_ENV, "60"))
        return CycleCostDepthPolicy(initial_steps, candidate_steps, use_device_events=use_device_events,
                                    log_interval_s=interval)
    return None


# ---- hooks -------------------------------------------------------------------------------
def add_cli_flag(result, parser, *args, **kwargs):
    """AFTER ``ServerArgs.add_cli_args(parser)``: add ``--speculative-depth-controller`` (and the
    benchmark-only ``--speculative-synthetic-acceptance``, ``controlled_acceptance.py``)."""
    controlled_acceptance.add_flag(parser)
    if FLAG not in parser._option_string_actions:
        add_plugin_argument(
            parser, FLAG,
            type=str,
            choices=list(CHOICES),
            default=None,
            help="Draft-depth policy for --speculative-adaptive (sglang-hybrid): fixed (stay at "
            "--speculative-num-steps), ema (upstream's accept-length EMA) or cycle-cost (committed "
            "tokens per measured cycle time). Default: cycle-cost for Kimi K3 / Qwen3.8-Flash-Next, "
            "ema otherwise.",
        )
    return None


def keep_cli_choice(server_args, cls, args, *rest, **kwargs):
    """AFTER ``ServerArgs.from_cli_args(args)``: store the flag on the record (and the environment)."""
    controlled_acceptance.keep_flag(args)
    value = getattr(args, FLAG[2:].replace("-", "_"), None)
    if value:
        setattr(server_args, SERVER_ARGS_ATTR, value)
        os.environ[ENV] = value  # processes spawned later inherit it, whatever copy of the record they get
    return None


def _target_architectures(worker) -> List[str]:
    try:
        return list(worker._target_worker.model_runner.model_config.hf_config.architectures or [])
    except AttributeError:
        return []


def install_policy(result, worker, server_args, *args, **kwargs):
    """AFTER ``EAGLEWorkerV2.__init__``: replace upstream's EMA policy per ``--speculative-depth-controller``."""
    choice, why = resolve_controller_choice(server_args, _target_architectures(worker))
    adaptive = getattr(worker, "adaptive_controller", None)
    if adaptive is None:
        if getattr(server_args, SERVER_ARGS_ATTR, None) not in (None, "ema"):
            logger.warning("%s %s has no effect: upstream's adaptive speculation is off for this worker "
                           "(needs --speculative-adaptive with EAGLE/EAGLE3, topk=1)", FLAG, choice)
        return None
    from sglang.srt.speculative.adaptive_spec_params import resolve_candidate_steps_from_config

    steps = resolve_candidate_steps_from_config(getattr(server_args, "speculative_adaptive_config", None))
    device = str(getattr(worker, "device", "cpu"))
    policy = make_policy(choice, worker.speculative_num_steps, steps, use_device_events=device.startswith("cuda"))
    if policy is not None:
        adaptive.params = policy
    logger.info("speculative depth controller: %s (%s); depths %s", choice, why,
                adaptive.params.candidate_steps)
    return None


def _is_extend(batch) -> bool:
    mode = getattr(batch, "forward_mode", None)
    return bool((mode is not None and mode.is_extend()) or getattr(batch, "is_extend_in_batch", False))


def around_forward_batch_generation(original, worker, batch, *args, **kwargs):
    """AROUND ``EAGLEWorkerV2.forward_batch_generation``: hand the controller what the policy call lacks."""
    adaptive = getattr(worker, "adaptive_controller", None)
    policy = getattr(adaptive, "params", None)
    if isinstance(policy, CycleCostDepthPolicy):
        if _is_extend(batch):
            policy.mark_non_decode_step()
        else:
            reqs = getattr(batch, "reqs", None) or []
            policy.set_next_request_ids([getattr(r, "rid", None) for r in reqs])
    return original(worker, batch, *args, **kwargs)


def install() -> None:
    """Register the hooks above (applied by upstream's ``load_plugins``)."""
    register_patches(__name__)  # the four hooks declared in patches.py
    register_patches(controlled_acceptance.__name__)  # AROUND verify_tree_greedy_func (benchmark only)
