"""Optax continued pretraining of an NNX causal LM, with Orbax checkpoints and exact resume.

* AdamW (decay on matrices only), constant learning rate by default (as in the paper), optional linear
  warm-up and cosine decay; global-norm gradient clipping; gradient accumulation over micro-batches
  (``lax.scan`` inside one jit-compiled step, gradients summed and divided by the step's real token count,
  so the update equals one big batch's).
* The step (loss, accumulation, update) is train/step.py: float32 master weights and optimizer state,
  optional bfloat16 compute.
* Checkpoints: an Orbax ``CheckpointManager`` in ``workdir/checkpoints`` every ``checkpoint_every`` steps and
  at the end, holding the parameters, the optimizer state and the metric history. Orbax writes a step into a
  temporary folder and renames it when complete, so a write interrupted by a crash or a full disk never
  replaces the previous checkpoint: the next run resumes from the last complete one. Saves are asynchronous:
  the save copies the arrays to the host and records the input position, and the training steps go on while
  Orbax's background thread writes the rest; the trainer waits for that write before the next save, at the end, before
  raising on a preemption (the preemption checkpoint is complete when the process stops), before ``on_step`` of a
  step whose checkpoint started (``on_step`` sees it complete) and before any other exception leaves ``train``.
* Throughput: ``speed.jsonl`` in the workdir (train/speed.py): per step its wall time, tokens, tokens/s and MFU
  against ``train.peak_tflops`` (x the mesh's devices), the compile step and the steps of a save marked; the
  progress bar shows tokens/s and MFU. Nothing wall-clock enters ``metrics.jsonl`` or the checkpoints.
* Preemption: a ``SIGTERM`` to any process (``mia_jax.runs.preemption``) stops every process after the same step, which
  is checkpointed first; the same command resumes from it, exactly.
* Exact resume: the batches are a pure function of the step (train/data.py) and the step function is
  deterministic, so a run killed after a checkpoint and resumed ends with the same parameters and the same
  per-step metrics as an uninterrupted run. Resuming is refused (UserError) when anything that defines the
  run differs (``fingerprint``: model files, packed-data hash, training config).
* Input: the steps are read through a grain iterator (train/grain_input.py: the packed sequences from an
  ArrayRecord file, or from memory; each process reads only its own rows), whose state (the data position) is an
  item of every checkpoint, checked against the checkpoint's step on restore. ``batches.jsonl`` records the
  sequence indices of every step's global batch (-1 = a dummy row), the lines of a killed run's steps up to its
  checkpoint kept on resume: an interrupted and resumed run's file equals the uninterrupted run's.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import optax
import orbax.checkpoint as ocp
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from tqdm.auto import tqdm

from mia_jax.runs import processes
from mia_jax.runs import entry, preemption, rundir
from mia_jax.engine import sharding
from mia_jax.errors import UserError
from train import placement
from train.config import TrainConfig
from train.data import Batches
from train.grain_input import DataRestore, DataSave, process_shard, step_iterator
from train.speed import SPEED_LOG, SpeedLog, train_flops_per_token
from train.step import make_step

# what may differ between an interrupted run and its resumption without changing the result (the mesh changes
# the order of floating-point reductions only: a run resumed on another mesh ends within float32 rounding)
NOT_IN_FINGERPRINT = ("checkpoint_every", "keep_checkpoints", "progress", "mesh", "peak_tflops")
BATCH_LOG = "batches.jsonl"


def learning_rate(cfg: TrainConfig, total_steps: int) -> optax.Schedule:
    """The learning-rate schedule of ``cfg`` over ``total_steps``: linear warm-up, then constant or cosine decay."""
    warm = min(cfg.warmup_steps, total_steps)
    if cfg.schedule == "constant":
        main = optax.constant_schedule(cfg.lr)
    else:
        main = optax.cosine_decay_schedule(cfg.lr, max(1, total_steps - warm), alpha=cfg.min_lr_ratio)
    if not warm:
        return main
    return optax.join_schedules([optax.linear_schedule(0.0, cfg.lr, warm), main], [warm])


def optimizer(cfg: TrainConfig, total_steps: int) -> optax.GradientTransformation:
    """The optimizer of ``cfg`` over ``total_steps``: AdamW (weight decay on matrices only), after gradient clipping
    when ``max_grad_norm`` is set and on the flipped gradient when the objective is ``ascent``."""
    adamw = optax.adamw(learning_rate(cfg, total_steps), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                        weight_decay=cfg.weight_decay, mask=lambda p: jax.tree.map(lambda x: x.ndim >= 2, p))
    # gradient ascent: the gradient's sign flipped before Adam (Adam's update is odd in the gradient, so this is
    # AdamW climbing the loss; the decoupled weight decay still shrinks the weights)
    steps = ([optax.clip_by_global_norm(cfg.max_grad_norm)] if cfg.max_grad_norm is not None else []) + \
        ([optax.scale(-1.0)] if cfg.objective == "ascent" else [])
    return optax.chain(*steps, adamw) if steps else adamw


_STEP_CACHE: dict = {}  # (graphdef, shapes, optimizer config, steps, mesh) -> jitted step: one compilation per process
OPTIMIZER_FIELDS = ("lr", "schedule", "objective", "warmup_steps", "min_lr_ratio", "weight_decay", "b1", "b2",
                    "eps", "max_grad_norm", "compute_dtype", "remat", "loss_chunk")


def train_step_for(model: nnx.Module, cfg: TrainConfig, total_steps: int, mesh: Mesh | None = None):
    """``make_train_step`` for this model, config and mesh, memoised (a resumed or repeated run reuses the compiled
    step)."""
    graphdef, state = nnx.split(model)
    shapes = tuple((str(p), x.shape, str(x.dtype)) for p, x in jax.tree_util.tree_flatten_with_path(state)[0])
    # the schedule depends on the number of steps only when it decays
    steps = total_steps if cfg.schedule == "cosine" else None
    key = (graphdef, shapes, tuple(getattr(cfg, f) for f in OPTIMIZER_FIELDS), steps, mesh)
    if key not in _STEP_CACHE:
        _STEP_CACHE.clear()  # keep at most one (a compiled step holds no parameters, but keep memory flat)
        _STEP_CACHE[key] = make_train_step(model, optimizer(cfg, total_steps), cfg.compute_dtype, mesh=mesh,
                                           remat=cfg.remat, loss_chunk=cfg.loss_chunk)
    return _STEP_CACHE[key]


def make_train_step(model: nnx.Module, opt: optax.GradientTransformation, compute_dtype: str = "float32", *,
                    mesh: Mesh | None = None, remat: str = "none", loss_chunk: int = 8192):
    """A jitted ``(params, opt_state, ids, mask) -> (params, opt_state, metrics)``; ids/mask [A, M, T]
    (``train.step.make_step``). With ``mesh``: parameters and AdamW moments on their rule shardings, the batch
    split over data x fsdp (``train.placement``), metrics replicated; params and optimizer state are donated."""
    step = make_step(model, opt, compute_dtype, remat=remat, loss_chunk=loss_chunk, mesh=mesh)
    if mesh is None:
        return jax.jit(step, donate_argnums=(0, 1))
    params_target, opt_target = placement.state_targets(model, opt, mesh)
    batch = placement.batch_sharding(mesh)
    params_sh, opt_sh = placement.shardings_of(params_target), placement.shardings_of(opt_target)
    return jax.jit(step, in_shardings=(params_sh, opt_sh, batch, batch),
                   out_shardings=(params_sh, opt_sh, NamedSharding(mesh, P())), donate_argnums=(0, 1))


@dataclass
class TrainResult:
    """What ``train`` returns: the trained float32 ``params``, per-step metrics, the step count, the step resumed from,
    and the time and throughput of the steps run here."""
    params: dict  # float32 nested dict (nnx.to_pure_dict layout)
    metrics: list[dict]  # per step: step, loss, grad_norm, lr, tokens
    steps: int
    resumed_from: int | None  # step of the checkpoint the run resumed from
    seconds: float  # wall time of the steps run in this process (the loop's iterations; the compile step excluded)
    tokens_per_second: float | None  # target tokens per second over those steps


def fingerprint(cfg: TrainConfig, **extra) -> dict:
    """What defines a training run (``cfg`` less display-only keys, plus ``extra``): a checkpoint resumes only under the
    same."""
    # objective "lm" and sampler "numpy" are what every run did before the fields existed: left out, so those runs
    # still resume
    return {"train": {k: v for k, v in asdict(cfg).items()
                      if k not in NOT_IN_FINGERPRINT and (k, v) not in (("objective", "lm"), ("sampler", "numpy"))},
            **extra}


def _manager(workdir: Path, cfg: TrainConfig) -> ocp.CheckpointManager:
    return ocp.CheckpointManager(
        (workdir / "checkpoints").absolute(),
        options=ocp.CheckpointManagerOptions(max_to_keep=max(1, cfg.keep_checkpoints), create=True,
                                             enable_async_checkpointing=True),
        item_names=("state", "meta", "data"))


def _settle(folder: Path, quiet_s: float = 1.0, limit_s: float = 60.0) -> None:
    """Wait until nothing under ``folder``'s unfinished (``*-tmp``) checkpoint folders changes for ``quiet_s``.

    When one item of a checkpoint fails (a full disk while writing ``meta``), Orbax raises at once while the other
    item's array writes go on in its threads; a process that then dies stops them, but a caller that resumes in the
    same process would race them (Orbax's clean-up of the unfinished folder fails with "Directory not empty")."""
    def snapshot():
        try:
            return sorted((str(p), p.stat().st_size, p.stat().st_mtime_ns)
                          for tmp in folder.glob("*-tmp*") for p in tmp.rglob("*"))
        except FileNotFoundError:  # a file went away while listing: still changing
            return None
    end, last, quiet_since = time.monotonic() + limit_s, snapshot(), time.monotonic()
    while time.monotonic() < end and time.monotonic() - quiet_since < quiet_s:
        time.sleep(0.1)
        now = snapshot()
        if now != last or now is None:
            last, quiet_since = now, time.monotonic()


def train(model: nnx.Module, batches: Batches, cfg: TrainConfig, workdir: str | Path, run_fingerprint: dict,
          on_step: Callable[[int], None] | None = None, mesh: Mesh | None = None) -> TrainResult:
    """Train ``model``'s parameters for ``batches.total_steps`` steps, resuming from ``workdir`` when it holds a
    checkpoint of the same run (written on any mesh). ``mesh``: default ``sharding.make_mesh(cfg.mesh)`` (every
    device on ``data`` when ``train.mesh`` is unset). ``on_step(step)`` is called after each step (and its
    checkpoint, if any, complete). On several processes every process calls this with the same arguments; process 0
    writes the files besides the checkpoints (Orbax coordinates those)."""
    workdir = Path(workdir)
    mesh = mesh if mesh is not None else sharding.make_mesh(cfg.mesh)
    placement.check(model, mesh, batches.batch_size, batches.grad_accum, batches.seq_len, cfg.remat,
                    cfg.loss_chunk)  # before anything is written
    main = processes.is_main_process()
    total = batches.total_steps
    opt = optimizer(cfg, total)
    schedule = learning_rate(cfg, total)
    target = dict(zip(("params", "opt_state"), placement.state_targets(model, opt, mesh)))
    fp_path = workdir / "fingerprint.json"
    _check_same_run(workdir, fp_path, run_fingerprint)
    workdir.mkdir(parents=True, exist_ok=True)
    mngr = _manager(workdir, cfg)
    shape = (batches.grad_accum, batches.batch_size // batches.grad_accum, batches.seq_len)
    # this process's rows of every micro-batch, as grain's ShardOptions (all of them on one process)
    data = step_iterator(batches, process_shard(placement.local_rows(mesh, shape), shape[1]))
    params, opt_state, metrics, resumed_from = _restore_or_init(mngr, model, opt, target, data)
    start = resumed_from or 0
    if main:
        fp_path.write_text(json.dumps(run_fingerprint, indent=2) + "\n")
    log = BatchLog(workdir / BATCH_LOG, batches, start) if main else None

    step_fn = train_step_for(model, cfg, total, mesh)
    peak = cfg.peak_tflops * 1e12 * mesh.size if cfg.peak_tflops else None
    speed = SpeedLog(workdir / SPEED_LOG if main else None, start, train_flops_per_token(model, batches.seq_len), peak)
    bar = tqdm(total=total, initial=start, desc="training", unit="step", disable=not (cfg.progress and main))
    preempted = False
    try:
        for step in range(start, total):
            t0 = time.perf_counter()
            saving = mngr.is_saving_in_progress()  # an earlier checkpoint still being written during this step
            item = next(data)
            if item["step"] != step:
                raise RuntimeError(f"the input iterator gave step {item['step']} for step {step}")
            params, opt_state, m = step_fn(params, opt_state, placement.global_batch(mesh, item["ids"], shape),
                                           placement.global_batch(mesh, item["mask"], shape))
            m = jax.device_get(m)
            metrics.append({"step": step + 1, "loss": float(m["loss"]), "grad_norm": float(m["grad_norm"]),
                            "lr": float(schedule(step)), "tokens": int(m["tokens"])})
            if log is not None:
                log.write(step + 1, item["index"])
            preempted = step + 1 < total and preemption.agreed()  # a notice to any process: all stop after this step
            due = preempted or (cfg.checkpoint_every and (step + 1) % cfg.checkpoint_every == 0) or step + 1 == total
            # the metrics list goes on growing while the checkpoint is written: it gets a copy
            meta = {"metrics": list(metrics), "fingerprint": run_fingerprint, "mesh": sharding.mesh_str(mesh)}
            save_s = _save(mngr, step + 1, params, opt_state, meta, data, workdir) if due else None
            speed.write(step + 1, time.perf_counter() - t0, int(m["tokens"]), save_s, saving)
            bar.set_postfix(loss=f"{metrics[-1]['loss']:.4f}", **speed.postfix())
            bar.update(1)
            if preempted:
                break
            if on_step is not None:
                if save_s is not None:
                    _wait(mngr, workdir)  # on_step sees the step's checkpoint complete
                on_step(step + 1)
            entry.check_interrupted()  # a Ctrl-C that Python swallowed (see rundir) stops here
        _wait(mngr, workdir)  # the last checkpoint (or the preemption's) complete
    except BaseException:
        _wait_quietly(mngr, workdir)  # no write of this process left going (a caller may resume in this process)
        speed.close()
        raise
    bar.close()
    speed.close()
    mngr.close()
    data.close()
    if preempted:
        if log is not None:
            log.close()
        raise preemption.Preempted(f"training step {step + 1} of {total}")  # "... (saved)": its checkpoint
    if main:
        log.close()
        (workdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))
    return TrainResult(placement.to_host(params), metrics, total, resumed_from, speed.seconds, speed.tokens_per_s)


class BatchLog:
    """``batches.jsonl``: one line per step, ``{"step": s, "index": [sequence of each row of the global batch]}``.
    Opened at ``start``: the lines of steps up to ``start`` already there are kept (those written by the run that
    made the checkpoint); missing ones (a folder of a run made before the file existed) are written from ``batches``
    (the index of a step is a pure function of it), later ones (steps after the checkpoint, trained again) dropped."""

    def __init__(self, path: Path, batches: Batches, start: int):
        lines = path.read_text().splitlines(keepends=True) if path.exists() else []
        kept = [line for line in lines[:start] if line.endswith("\n")]
        kept += [self.line(s + 1, batches.indices(s)) for s in range(len(kept), start)]
        path.write_text("".join(kept))
        self.file = path.open("a")

    @staticmethod
    def line(step: int, index) -> str:
        """The line of ``step``."""
        return json.dumps({"step": step, "index": [int(i) for i in index]}) + "\n"

    def write(self, step: int, index) -> None:
        """Append (and flush) the line of ``step``."""
        self.file.write(self.line(step, index))
        self.file.flush()

    def close(self) -> None:
        """Close the file."""
        self.file.close()


def _check_same_run(workdir: Path, fp_path: Path, run_fingerprint: dict) -> None:
    """Raises ``UserError`` when ``workdir`` holds checkpoints of a run whose fingerprint (``fp_path``) differs."""
    if _latest_step(workdir) is not None:
        old = json.loads(fp_path.read_text()) if fp_path.exists() else {}
        changes = rundir.diff(old, run_fingerprint)
        if changes:
            raise UserError(f"{workdir} holds checkpoints of a different training run; refusing to resume with a "
                            f"changed config ({'; '.join(changes[:8])}). Use another --out, restore the original "
                            "config, or delete the folder (--overwrite) to start afresh")


def _restore_or_init(mngr: ocp.CheckpointManager, model: nnx.Module, opt, target: dict, data) -> tuple:
    """(params, opt_state, metrics, step resumed from or None): the latest checkpoint's, else fresh ones placed on
    ``target``'s shardings. The input iterator ``data`` is moved to the checkpoint's data position (a checkpoint
    written before the position was saved: its step, the position being a pure function of it)."""
    latest = mngr.latest_step()
    if latest is None:
        params = placement.place_params(model, placement.shardings_of(target["params"]))
        return params, jax.jit(opt.init, out_shardings=placement.shardings_of(target["opt_state"]))(params), [], None
    # each array is read straight onto its sharding on *this* mesh (the checkpoint's mesh does not matter)
    items = {"state": ocp.args.StandardRestore(target), "meta": ocp.args.JsonRestore()}
    saved_position = (Path(mngr.directory) / str(latest) / "data").is_dir()
    if saved_position:
        items["data"] = DataRestore(data)
    restored = mngr.restore(latest, args=ocp.args.Composite(**items))
    if not saved_position:
        data.set_state({"next_index": int(latest)})
    elif data.get_state().get("next_index") != int(latest):
        raise UserError(f"{mngr.directory}/{latest}: the saved data position {data.get_state()} is not step {latest}; "
                        "the checkpoint is damaged: delete it (or the folder, --overwrite) to start afresh")
    return (restored["state"]["params"], restored["state"]["opt_state"], restored["meta"]["metrics"],
            int(latest))


def _save(mngr: ocp.CheckpointManager, step: int, params, opt_state, meta: dict, data, workdir: Path) -> float:
    """Start the checkpoint of ``step`` (state, ``meta`` and the input iterator ``data``'s position), after the
    previous one's write is complete: the arrays are copied to the host and the small items written before this
    returns, the arrays written in the background (``_wait``). Returns the seconds it blocked (the wait for the
    previous write included). On a failure the unfinished folder settles before the error goes on (``_settle``)."""
    t0 = time.perf_counter()
    try:
        mngr.wait_until_finished()
        mngr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave({"params": params,
                                                                             "opt_state": opt_state}),
                                                meta=ocp.args.JsonSave(meta), data=DataSave(data)))
    except BaseException:
        _settle(workdir / "checkpoints")
        raise
    return time.perf_counter() - t0


def _wait(mngr: ocp.CheckpointManager, workdir: Path) -> None:
    """Wait until the checkpoint being written (if any) is complete; a failed write raises, after the unfinished
    folder settled (``_settle``)."""
    try:
        mngr.wait_until_finished()
    except BaseException:
        _settle(workdir / "checkpoints")
        raise


def _wait_quietly(mngr: ocp.CheckpointManager, workdir: Path) -> None:
    """``_wait`` while another error is on its way out: a failure of the write is left to that error (the folder
    settled, the previous checkpoint intact)."""
    try:
        _wait(mngr, workdir)
    except BaseException:  # noqa: S110 - the error being raised is the one to report
        pass


def _latest_step(workdir: Path) -> int | None:
    """The last complete checkpoint's step, read without creating anything (Orbax names them by step; its
    temporary folders of an interrupted write carry a suffix and are not counted)."""
    folder = workdir / "checkpoints"
    steps = [int(p.name) for p in folder.iterdir() if p.is_dir() and p.name.isdigit()] if folder.is_dir() else []
    return max(steps) if steps else None


def apply_params(model: nnx.Module, params: dict) -> nnx.Module:
    """A copy of ``model`` holding ``params`` (cast to the model's parameter dtype)."""
    graphdef, state = nnx.split(model)
    state = jax.tree.map(lambda x: x, state)
    dtypes = jax.tree.map(lambda x: x.dtype, nnx.to_pure_dict(state))
    nnx.replace_by_pure_dict(state, jax.tree.map(lambda x, d: jnp.asarray(x, d), params, dtypes))
    return nnx.merge(graphdef, state)
