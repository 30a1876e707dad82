"""The options of one ``kvcli route`` run besides its traces (:class:`RouteConfig`): frozen, checked when built."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from kvcli.figures import check_plot_path
from kvcli.model.load import check_model
from kvcli.route.policies import resolve_policies
from kvcli.route.report import plan_runs, sweep_points
from kvcli.route.simulator import SimConfig, check_prefill_tps, kv_bytes_per_token
from kvcli.units import check_count


@dataclass(frozen=True)
class RouteConfig:
    """Options of one routing run (frozen; built at the CLI edge, or by a library caller).

    Attributes:
        sim: the cluster and workload every run starts from (:class:`~kvcli.route.simulator.SimConfig`, which
            checks its own fields).
        policies: policy names as ``--policy`` takes them (names, comma-separated lists, ``all``); kept resolved
            (:func:`~kvcli.route.policies.resolve_policies`: known names, each once, in the given order).
        sweeps: ``--sweep PARAM=v1,v2`` options as given; :attr:`points` holds what they expand to.
        model: model preset or checkpoint folder: the measured cost curve (without ``prefill_tps``), the KV bytes per
            token of capacities given in bytes, and the default tokenizer of a checkpoint folder.
        prefill_tps: a flat prefill rate in tokens/s per node instead of the measured cost curve (None: measure).
        threads: torch's threads while the cost curve is measured.
        limit: only the first N requests of each trace (None: all of them).
        tokenizer: tiktoken encoding or tokenizer folder for text prompts (None: the ``model`` folder's own, else
            cl100k_base: :func:`kvcli.model.load.resolve_tokenizer`).
        plot: write hit ratio vs TTFT p99 here (``.png`` or ``.svg``; one file per trace:
            :func:`kvcli.figures.plot_paths`), or None.
        redis_url: the cache-manager's Redis (None: ``$REDIS_URL`` or the embedded server).
        redis_timeout: seconds for the connect and each Redis reply (None: the client's default).
        points: (derived) the sweep's points, ``((labels {param: text}, SimConfig), ...)``
            (:func:`~kvcli.route.report.sweep_points`; one point, ``({}, sim)``, without sweeps).
    """

    sim: SimConfig = field(default_factory=SimConfig)
    policies: tuple[str, ...] = ("all",)
    sweeps: tuple[str, ...] = ()
    model: str = "cpu"
    prefill_tps: float | None = None
    threads: int = 1
    limit: int | None = None
    tokenizer: str | None = None
    plot: Path | None = None
    redis_url: str | None = None
    redis_timeout: float | None = None
    points: tuple[tuple[dict, SimConfig], ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        """Check the options, in this order; each message names the ``kvcli route`` option that sets them.

        Raises:
            BadInputError: an unknown model preset or an unusable checkpoint folder (also with ``prefill_tps``: a
                typo should not pass silently); a limit or thread count below 1; a bad sweep (as
                :func:`~kvcli.route.report.sweep_points`); an unknown policy or none; a prefill rate that is not a
                finite number > 0; a plot path that is not a ``.png`` or ``.svg`` in a folder that exists.
        """
        check_model(self.model)
        check_count("--limit", self.limit)
        check_count("--threads", self.threads)
        kv = lambda: kv_bytes_per_token(self.model)  # noqa: E731 (only called for a capacity in bytes)
        object.__setattr__(self, "points", tuple(sweep_points(self.sim, list(self.sweeps), kv)))
        object.__setattr__(self, "policies", tuple(resolve_policies(self.policies)))
        check_prefill_tps(self.prefill_tps)
        check_plot_path(self.plot)

    @property
    def idle_sweeps(self) -> list[str]:
        """The swept parameters that change none of the policies run (each policy then runs once), in the order
        given."""
        planned = plan_runs(list(self.policies), list(self.points))
        names = [s.partition("=")[0].strip() for s in self.sweeps]
        return [p for p in names if not any(p in labels for _, labels, _ in planned)]
