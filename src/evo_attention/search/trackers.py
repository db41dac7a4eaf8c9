"""Experiment trackers: a search's evaluations and generations, live in TensorBoard, MLflow or W&B.

``--track tensorboard[:DIR]`` (default ``RUN_DIR/tensorboard``: each evaluation also in a run
directory of its own with HParams data), ``--track mlflow[:URI]`` (default an SQLite store,
``RUN_DIR/mlflow.db``: a child run per evaluation) and ``--track wandb`` (offline, into
``RUN_DIR/wandb``); the packages are the ``tracking`` extra. One tracker run per search, with the
config as its parameters; per evaluation its gene's parts (``gene_params``), learning curves, final
metrics and costs; per generation the best and mean perplexity so far. A resumed search continues
its tracker runs and logs only what earlier sessions did not (meta ``trackers``).

Only the search driver writes. A tracker that fails is reported once and dropped (``Guarded``): it
never stops the search, whose results are in the run store, the single source of truth.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import warnings
from pathlib import Path

from evo_attention.genes import ALL_FIELDS, RECIPE_FIELDS, AttentionGene, LayerGenes
from evo_attention.util.errors import UserError
from evo_attention.util.threads import environment_defaults

EXTRA_HINT = 'pip install -e ".[tracking]"'
METRICS = ("val_perplexity", "val_loss", "accuracy", "bits_per_byte", "train_loss")
COSTS = ("params", "flops_per_step", "time_s", "train_time_s", "tokens_per_s", "peak_memory_mb")


class Tracker:
    """What a tracker receives from the driver; every method may raise (``Guarded`` catches it)."""

    name = ""
    environment: dict = {}  # variables its calls run with (``Guarded``), where the user set none

    # set by the driver before ``start``: what the tracker kept of its tracker run (empty in a new search),
    # which it may fill (the driver keeps it in the run's meta) to continue that run when the search resumes
    state: dict

    def start(self, run_name: str, config: dict) -> None:
        pass

    def log_evaluation(self, index: int, record) -> None:
        pass

    def log_generation(self, generation: int, best: float | None, mean: float | None) -> None:
        pass

    def finish(self, state: str) -> None:
        pass


def _numbers(record, names) -> dict:
    values = {name: record.get(name) for name in names}
    return {name: float(v) for name, v in values.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


def gene_params(key: str) -> dict:
    """The gene's parts as tracker parameters: every gene field by its name (``L<i>.<field>`` for a
    per-layer genome), the recipe parts only where the gene sets them, all as strings."""
    try:
        genome = AttentionGene.parse(key)
    except (ValueError, UserError):  # a key naming a plugin's component that is not loaded here
        return {"gene": str(key)}
    layers = genome.layers if isinstance(genome, LayerGenes) else (genome,)
    out = {"gene": str(key)}
    for i, gene in enumerate(layers):
        prefix = f"L{i}." if len(layers) > 1 else ""
        values = {name: getattr(gene, name, None) for name in ALL_FIELDS}
        out.update({prefix + name: str(v) for name, v in values.items() if not (name in RECIPE_FIELDS and v is None)})
    return out


def _record_params(record) -> dict:
    """What an evaluation's tracker run is: the gene's parts, its role, generation, seed and steps."""
    return {**gene_params(record["gene"]), "role": str(record.get("role")),
            "generation": str(record.get("generation")), "seed": str(record.get("seed")),
            "steps": str(record.get("steps"))}


def _flat(config: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = json.dumps(value) if isinstance(value, (list, dict)) else str(value)
    return out


class TensorBoardTracker(Tracker):
    name = "tensorboard"

    def __init__(self, directory: str | os.PathLike):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise UserError(f"tracker tensorboard needs the tensorboard package: {EXTRA_HINT}", setting="track") from None
        self.directory = Path(directory)
        self._writer_class = SummaryWriter
        self.writer = None

    def start(self, run_name, config):
        self.writer = self._writer_class(str(self.directory))  # a resumed search appends to the same directory
        self.writer.add_text("config", "\n".join(f"    {k}: {v}" for k, v in _flat(config).items()))

    def log_evaluation(self, index, record):
        from torch.utils.tensorboard.summary import hparams

        numbers = _numbers(record, METRICS + COSTS)
        for name, value in numbers.items():
            self.writer.add_scalar(f"evaluations/{name}", value, index)
        self.writer.add_text("evaluations/gene", f"{index}: {record['gene']} ({record.get('role')}, generation "
                             f"{record.get('generation')}, {record['status']})", index)
        self.writer.flush()
        # the evaluation's own run: its curves and HParams data (the HParams dashboard's one row)
        run = self._writer_class(str(self.directory / run_directory(index, record["gene"])))
        try:
            for curve, tag in (("curve", "curve/train_loss"), ("val_curve", "curve/val_loss")):
                for step, loss in record.get(curve) or []:
                    run.add_scalar(tag, loss, step)
            metrics = {f"final/{k}": v for k, v in numbers.items()}
            for summary in hparams({**_record_params(record), "status": str(record["status"])}, metrics):
                run.file_writer.add_summary(summary)
            for name, value in metrics.items():
                run.add_scalar(name, value, 0)
        finally:
            run.close()

    def log_generation(self, generation, best, mean):
        for name, value in (("best_so_far", best), ("mean", mean)):
            if value is not None:
                self.writer.add_scalar(f"search/{name}", value, generation)
        self.writer.flush()

    def finish(self, state):
        if self.writer is not None:
            self.writer.add_text("state", state)
            self.writer.close()


def run_directory(index: int, gene: str) -> str:
    """The TensorBoard run directory of evaluation ``index`` (inside the tracker's directory)."""
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", f"{index:04d}_{gene}")[:120]


class MLflowTracker(Tracker):
    """A parent run per search (the config as params), a child run per evaluation (the gene's parts,
    role, generation, seed and steps as params; the same as tags, for search filters)."""

    name = "mlflow"
    EXPERIMENT = "evo-attention"
    # a server down fails its first call in seconds, not after MLflow's 7 retries with backoff (minutes)
    environment = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "20"}

    def __init__(self, uri: str):
        try:
            import mlflow  # noqa: F401
            from mlflow.tracking import MlflowClient
        except ImportError:
            raise UserError(f"tracker mlflow needs the mlflow package (mlflow or mlflow-skinny): {EXTRA_HINT}",
                            setting="track") from None
        for name in ("mlflow", "alembic"):  # their INFO lines (creating a store's tables) are not the tool's output
            logging.getLogger(name).setLevel(logging.WARNING)
        if "://" not in uri and not uri.startswith("file:"):  # a path: a file store there (a folder)
            uri = Path(uri).expanduser().resolve().as_uri()
        if uri.startswith("file:"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 reads file stores only with it
        self.uri = uri
        self._client_class = MlflowClient
        self.client = self.run_id = None

    def start(self, run_name, config):
        self.client = self._client_class(tracking_uri=self.uri)
        experiment = self.client.get_experiment_by_name(self.EXPERIMENT)
        self.experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(self.EXPERIMENT)
        if self.state.get("run_id"):  # a resumed search: its parent run again, whose params are logged
            try:
                self.client.update_run(self.state["run_id"], status="RUNNING")
                self.run_id = self.state["run_id"]
                return
            except Exception:  # noqa: BLE001 - not at this URI (deleted, another store): a new run logs it all
                self.state.clear()
        run = self.client.create_run(self.experiment_id, run_name=run_name, tags={"evo_attention.role": "search"})
        self.run_id = self.state["run_id"] = run.info.run_id
        from mlflow.entities import Param

        params = [Param(k, v[:500]) for k, v in _flat(config).items()]
        for start in range(0, len(params), 100):
            self.client.log_batch(self.run_id, params=params[start:start + 100])

    def log_evaluation(self, index, record):
        from mlflow.entities import Metric, Param

        params = _record_params(record)
        tags = {"mlflow.parentRunId": self.run_id, "status": str(record["status"]),
                **{k: params[k] for k in ("gene", "role", "generation", "seed", "steps")}}
        child = self.client.create_run(self.experiment_id, run_name=f"{index:04d} {record['gene']}", tags=tags)
        metrics = [Metric(k, v, 0, index) for k, v in _numbers(record, METRICS + COSTS).items()]
        metrics += [Metric("curve_train_loss", float(loss), 0, int(step)) for step, loss in record.get("curve") or []]
        metrics += [Metric("curve_val_loss", float(loss), 0, int(step)) for step, loss in record.get("val_curve") or []]
        self.client.log_batch(child.info.run_id, params=[Param(k, v[:500]) for k, v in params.items()])
        for start in range(0, len(metrics), 500):
            self.client.log_batch(child.info.run_id, metrics=metrics[start:start + 500])
        self.client.set_terminated(child.info.run_id)
        self.client.log_metric(self.run_id, "evaluations", index + 1, step=index)

    def log_generation(self, generation, best, mean):
        for name, value in (("best_so_far", best), ("mean_perplexity", mean)):
            if value is not None:
                self.client.log_metric(self.run_id, name, value, step=generation)

    def finish(self, state):
        if self.run_id is not None:
            self.client.set_terminated(self.run_id, {"finished": "FINISHED", "interrupted": "KILLED"}.get(state, "FAILED"))


class WandbTracker(Tracker):
    """Weights & Biases in offline mode (``wandb sync`` uploads it later)."""

    name = "wandb"

    def __init__(self, directory: str | os.PathLike):
        try:
            import wandb
        except ImportError:
            raise UserError("tracker wandb needs the wandb package: pip install wandb", setting="track") from None
        self.wandb, self.directory, self.run = wandb, Path(directory), None

    def start(self, run_name, config):
        self.directory.mkdir(parents=True, exist_ok=True)
        self.run = self.wandb.init(project="evo-attention", name=run_name, config=config, mode="offline",
                                   dir=str(self.directory), reinit=True, id=self.state.get("id"), resume="allow")
        self.state["id"] = self.run.id

    def log_evaluation(self, index, record):
        self.run.log({**{f"evaluation/{k}": v for k, v in _numbers(record, METRICS + COSTS).items()},
                      "evaluation/index": index, "evaluation/gene": record["gene"]})

    def log_generation(self, generation, best, mean):
        self.run.log({"search/generation": generation, "search/best_so_far": best, "search/mean": mean})

    def finish(self, state):
        if self.run is not None:
            self.run.finish(exit_code=0 if state == "finished" else 1)


def _guarded(method: str):
    """``Guarded``'s ``method``: the tracker's, unless the tracker failed before; a failure is reported once."""
    def call(self, *args) -> None:
        if self.failed:
            return
        try:
            with environment_defaults(self.tracker.environment):  # one thread, the driver's, calls
                getattr(self.tracker, method)(*args)
        except Exception as exc:  # noqa: BLE001 - any failure of a view must leave the search running
            self.failed = True
            warnings.warn(f"tracker {self.name} failed ({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}); "
                          "the search goes on without it (its results are in the run store)", stacklevel=2)

    return call


class Guarded(Tracker):
    """A tracker whose failures are reported once and then ignored: a tracker never stops a search."""

    def __init__(self, tracker: Tracker):
        self.tracker, self.name, self.failed = tracker, tracker.name, False

    @property
    def state(self) -> dict:
        return self.tracker.state

    @state.setter
    def state(self, value: dict) -> None:
        self.tracker.state = value

    start, finish = _guarded("start"), _guarded("finish")
    log_evaluation, log_generation = _guarded("log_evaluation"), _guarded("log_generation")


def make_tracker(spec: str, run_dir: str | os.PathLike) -> Tracker:
    """The tracker ``spec`` (``tensorboard[:DIR]``, ``mlflow[:URI]``, ``wandb``) for a run in ``run_dir``."""
    name, _, target = str(spec).partition(":")
    name = name.strip().lower()
    run_dir = Path(run_dir)
    if name == "tensorboard":
        return Guarded(TensorBoardTracker(target or run_dir / "tensorboard"))
    if name == "mlflow":
        return Guarded(MLflowTracker(target or f"sqlite:///{(run_dir / 'mlflow.db').resolve()}"))
    if name == "wandb":
        if target:
            raise UserError("tracker wandb takes no target: it runs offline into RUN_DIR/wandb", setting="track")
        return Guarded(WandbTracker(run_dir / "wandb"))
    raise UserError(f"unknown tracker {spec!r}: valid trackers are tensorboard[:DIR], mlflow[:URI], wandb",
                    setting="track")
