"""Planning one micro-batch: feplb.plan() and feplb.Planner, plans as numpy arrays."""

from __future__ import annotations

import dataclasses

import numpy as np

from . import _args, _data, _feplb


@dataclasses.dataclass(frozen=True)
class Knob:
    """One tunable from feplb/core/knobs.def (`feplb knobs` prints the same table)."""

    name: str
    type: str  # "int" or "float"
    default: int | float
    minimum: float
    unit: str
    help: str


def knobs() -> dict[str, Knob]:
    """Every knob by name, in declaration order. Pass them to plan(), Planner and simulate() as
    keyword arguments (e.g. max_num_dyn=8, copy_gbps=300)."""
    return {row[0]: Knob(*row) for row in _feplb.knob_table()}


def policies() -> list[str]:
    """Every planner's name, in the order `feplb simulate` lists them."""
    return list(_feplb.policies())


@dataclasses.dataclass(frozen=True)
class Slices:
    """rows[i] token-expert rows of expert[i] computed on gpu[i]; home[i] is the expert's home GPU
    (gpu != home: a helper). source[i]: where the rows are when phase 2 starts: "home" (sent on
    by a token-row copy when gpu != home), "source" (never left their rank: FasterMoE),
    "dispatched" (sent straight to gpu by the EP dispatch: EPLB, LLEP, MoonEP)."""

    expert: np.ndarray
    home: np.ndarray
    gpu: np.ndarray
    rows: np.ndarray
    source: np.ndarray

    def __len__(self) -> int:
        return len(self.expert)


@dataclasses.dataclass(frozen=True)
class Copies:
    """The plan's copies: kind[i] ("weights", "token_rows", "output_rows", "replica_weights") of
    expert[i] from src_gpu[i] to dst_gpu[i], carrying rows[i] token rows (0 for weights) and
    bytes[i] bytes."""

    kind: np.ndarray
    expert: np.ndarray
    src_gpu: np.ndarray
    dst_gpu: np.ndarray
    rows: np.ndarray
    bytes: np.ndarray

    def __len__(self) -> int:
        return len(self.kind)


@dataclasses.dataclass(frozen=True)
class Schedule:
    """When the plan's copies run and the order each GPU runs its work in, as its planner modelled
    it (ms from when the GPUs start their expert GEMMs; -inf: never). Each GPU runs its own experts
    (own_ms), then, once the weights prefetched into it have landed (prefetch_ms), the guests
    that need no phase-2 copy (ready_ms), then turn by turn each owner whose phase-2 copies into
    it land (turn_*, per GPU in running order). Each GPU issues its phase-2 copies helper by
    helper (helper_gpu[i] sends to helper[i], in issue order). The GPU layer runs plans in this
    order; the metrics read it."""

    copy_start_ms: float  # when the phase-2 copies were modelled to start
    copy_start: np.ndarray  # [copies] per copy of Plan.copies
    copy_end: np.ndarray
    copy_timed: np.ndarray  # 0: not waited for (outputs back, replicas)
    own_ms: np.ndarray  # [num_ranks]
    prefetch_ms: np.ndarray  # [num_ranks]
    ready_ms: np.ndarray  # [num_ranks]
    turn_gpu: np.ndarray  # [turns]
    turn_owner: np.ndarray
    turn_lands_ms: np.ndarray  # when the owner's last phase-2 copy into the GPU lands
    turn_gemm_ms: np.ndarray  # the owner's guests' GEMM time there
    turn_wait_ms: np.ndarray  # the GPU's modelled idle time just before them
    helper_gpu: np.ndarray  # [pairs]
    helper: np.ndarray


@dataclasses.dataclass(frozen=True)
class Plan:
    """One (micro-batch, layer)'s balancing decision, validated against the counts and the
    topology (every row computed exactly once, weights and rows wherever they are computed,
    copies inside NVLink domains, guest slots respected). Arrays are copies owned by Python."""

    policy: str
    slices: Slices
    copies: Copies
    weight_bytes: int  # weights copied for this micro-batch plus replicas installed
    token_bytes: int  # token rows to helpers plus outputs back
    dynamic: np.ndarray  # [num_experts] 1 = computed after the plan (not static work)
    resident: np.ndarray  # [n, 2] (expert, gpu) replica weights kept on a non-home GPU
    home_rows: np.ndarray  # [num_ranks] rows of each GPU's own experts computed there
    guest_rows: np.ndarray  # [num_ranks] rows of other GPUs' experts computed there
    gemm_ms: np.ndarray  # [num_ranks] modelled expert GEMM time per GPU
    metrics: dict  # token/GEMM straggler, bytes by link, copy window, planner_us (measured)
    schedule: Schedule  # when its copies run and each GPU's order of work, as planned
    serialized: bytes  # canonical bytes of the plan (equal plans, equal bytes)

    @property
    def rows_per_gpu(self) -> np.ndarray:
        """[num_ranks] token-expert rows each GPU computes under this plan."""
        return self.home_rows + self.guest_rows

    def __repr__(self) -> str:
        m = self.metrics
        return (
            f"Plan(policy={self.policy!r}, {len(self.slices)} slices, {len(self.copies)} copies, "
            f"token straggler {m['token_straggler']:.0f} rows ({m['token_max_over_mean']:.3f}x "
            f"mean), weights {self.weight_bytes} B, tokens {self.token_bytes} B)"
        )


def _plan_from(policy: str, d: dict) -> Plan:
    return Plan(
        policy=policy,
        slices=Slices(
            expert=d["slice_expert"],
            home=d["slice_home"],
            gpu=d["slice_gpu"],
            rows=d["slice_rows"],
            source=np.array(d["slice_source"], dtype=str),
        ),
        copies=Copies(
            kind=np.array(d["copy_kind"], dtype=str),
            expert=d["copy_expert"],
            src_gpu=d["copy_src_gpu"],
            dst_gpu=d["copy_dst_gpu"],
            rows=d["copy_rows"],
            bytes=d["copy_bytes"],
        ),
        weight_bytes=d["weight_bytes"],
        token_bytes=d["token_bytes"],
        dynamic=d["dynamic"],
        resident=np.stack([d["resident_expert"], d["resident_gpu"]], axis=1),
        home_rows=d["home_rows"],
        guest_rows=d["guest_rows"],
        gemm_ms=d["gemm_ms"],
        metrics=d["metrics"],
        schedule=Schedule(**d["schedule"]),
        serialized=d["serialized"],
    )


class Planner:
    """One policy on one topology, planning micro-batch after micro-batch. Policies that learn
    from history (eplb, feplb-paper) see every step plan() is given unless observe=False.

    policy: a name from policies(). topology: feplb.Topology. shape: feplb.ExpertShape or a known
    model name; it sets the bytes moved and the GEMM cost model. cost_model: "auto" (the measured
    H200 table when the shape is GLM-5's, else the roofline), "roofline" or a feplb-gemm-table-v1
    file. dynamic: [num_experts] 0/1, a placement's dynamic sets (feplb_dyn_set=1,
    paper_dyn_set=2). knobs: any of knobs(), by name.
    """

    def __init__(
        self,
        policy: str = "feplb",
        *,
        topology: _feplb.Topology,
        shape,
        cost_model: str = "auto",
        dynamic=None,
        **knobs,
    ):
        if not isinstance(policy, str):
            raise ValueError(f"policy: expected a name, got {type(policy).__name__}")
        _args.text(policy, "policy")
        if not isinstance(topology, _feplb.Topology):
            raise ValueError(
                f"topology: expected feplb.Topology, got {type(topology).__name__}"
            )
        cost_model = _args.path(cost_model, "cost_model")
        if dynamic is not None:
            dynamic = _args.int_array(dynamic, "dynamic", "num_experts").tolist()
        self._impl = _feplb.Planner(
            policy,
            topology,
            _args.shape(shape),
            _args.knobs(knobs),
            cost_model,
            _data.data_dir(),
            dynamic,
        )

    @property
    def policy(self) -> str:
        return self._impl.policy

    @property
    def topology(self) -> _feplb.Topology:
        return self._impl.topology

    @property
    def shape(self) -> _feplb.ExpertShape:
        return self._impl.shape

    @property
    def cost_model(self) -> str:
        """How the GEMM cost model is named in reports."""
        return self._impl.cost_model

    def plan(self, counts, *, layer: int = 0, observe: bool = True) -> Plan:
        """Plans one (micro-batch, layer): counts[src, e] = token-expert rows rank src routes to
        expert e, an integer array [num_ranks, num_experts]."""
        counts = _args.int_array(counts, "counts", "num_ranks, num_experts")
        layer = _args.integer(layer, "layer", 0, _feplb.LIMITS["step_id"])
        return _plan_from(self.policy, self._impl.plan(counts, layer, bool(observe)))

    def observe(self, counts, *, layer: int = 0) -> None:
        """Shows the planner a step without planning it (history for eplb and feplb-paper)."""
        counts = _args.int_array(counts, "counts", "num_ranks, num_experts")
        self._impl.observe(counts, _args.integer(layer, "layer", 0, _feplb.LIMITS["step_id"]))

    def __repr__(self) -> str:
        return f"Planner({self.policy!r}, {self.topology!r}, {self.shape!r})"


def plan(
    counts,
    policy: str = "feplb",
    *,
    shape,
    topology: _feplb.Topology | None = None,
    gpus_per_node: int | None = None,
    cost_model: str = "auto",
    dynamic=None,
    **knobs,
) -> Plan:
    """Plans one micro-batch's counts [num_ranks, num_experts] with `policy` (a fresh planner: no
    history). The topology defaults to contiguous homes on counts' shape with gpus_per_node
    (default 8) GPUs per NVLink domain. See Planner for the other arguments."""
    counts = _args.int_array(counts, "counts", "num_ranks, num_experts")
    if topology is None:
        gpn = (
            8
            if gpus_per_node is None
            else _args.integer(gpus_per_node, "gpus_per_node", 1, _feplb.LIMITS["ranks"])
        )
        try:
            topology = _feplb.Topology(counts.shape[0], counts.shape[1], gpn)
        except ValueError as e:
            msg = f"counts: shape {counts.shape} [num_ranks, num_experts]: {e}"
            raise ValueError(msg) from None
    elif gpus_per_node is not None:
        raise ValueError("gpus_per_node: give it to feplb.Topology, not with topology=")
    planner = Planner(
        policy,
        topology=topology,
        shape=shape,
        cost_model=cost_model,
        dynamic=dynamic,
        **knobs,
    )
    return planner.plan(counts, observe=False)
