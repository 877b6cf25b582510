"""The PyTorch module engine: ``backend.name`` torch, ort or auto.

A Hugging Face model inside ``models.TaskModule``, wrapped by a module wrapper (``wrappers.py``):
eager PyTorch (``eager.py``) or ORTModule (``ortmodule/``), or the route a short probe estimates
fastest (``auto.py``) — then by DDP (under torchrun) or a DeepSpeed engine (``deepspeed:``), and
``backend.compile``'s torch.compile outside it all (``compiled.py``). Mixed precision is autocast
around the forward plus a GradScaler for fp16. The run's lifecycle (``ortft.run``) calls the
``Engine`` methods; everything that touches torch is here.

What it writes besides its steps (checkpoints, final/, the export) is in ``outputs.py``; the
run's tokenizer or processor in ``preprocessors.py``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ortft.backends import Started, StepResult
from ortft.backends.report import BackendReport, Precision
from ortft.backends.torch import (
    amp,
    compiled,
    distributed,
    hf_config,
    load_checks,
    master_weights,
    models,
    outputs,
    preprocessors,
)
from ortft.backends.torch import device as runtime
from ortft.backends.torch.wrappers import wrapper
from ortft.checkpoint import store as checkpoint
from ortft.checkpoint.store import TrainState
from ortft.core.errors import InputError
from ortft.core.reports import ExportReport
from ortft.recipe.io import LoadedRecipe
from ortft.tasks import Encoded, Task, protocols, traits

log = logging.getLogger("ortft")


def build_optimizer(params: list[torch.nn.Parameter], recipe: Any, device: torch.device) -> Any:
    o, t = recipe.optimizer, recipe.training
    if o.name == "adamw_ort_fused":
        from onnxruntime.training.optim import FusedAdam

        return FusedAdam(params, lr=t.lr, betas=o.betas, eps=o.eps, weight_decay=t.weight_decay)
    kw: dict[str, Any] = {}
    if o.implementation in ("auto", "fused"):
        kw["fused"] = True  # torch 2.6 has fused AdamW kernels for CPU and CUDA
    else:
        kw["foreach"] = o.implementation == "foreach"
    # no weight decay on biases and LayerNorm weights (1-D tensors)
    groups = [
        {"params": [p for p in params if p.ndim > 1], "weight_decay": t.weight_decay},
        {"params": [p for p in params if p.ndim <= 1], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=t.lr, betas=o.betas, eps=o.eps, **kw)


def to_device(batch: dict[str, np.ndarray], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(v).to(device) for k, v in batch.items() if not k.startswith("_")}


def create(loaded: LoadedRecipe) -> PyTorchEngine:
    return PyTorchEngine(loaded)


class PyTorchEngine:
    def __init__(self, loaded: LoadedRecipe):
        self.loaded, self.recipe = loaded, loaded.recipe
        self.name = self.recipe.backend.name
        self.device = torch.device("cpu")
        self.probe: dict[str, Any] | None = None  # backend.name=auto: the probe's record
        self.wrapper: Any = None
        self.deepspeed: Any = None  # DeepSpeed's engine, when the recipe has a deepspeed section
        self.skipped_steps = 0  # fp16: steps the GradScaler skipped (overflow)
        self.head: dict[str, Any] | None = None  # load_checks.settle_head's record
        self.dtype: str = self.recipe.precision.dtype  # precision.dtype=auto: resolved at start
        self.dtype_reason: str | None = None
        self.bf16: master_weights.Bf16Copy | None = None  # precision.weights=bf16 (prepare)

    # ---- start: device, threads, seeds, the process group
    def start(self, recipe: Any) -> Started:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # ortft reports its own progress on stderr
        if recipe.backend.compile is not False:  # before the model's imports (compiled.py)
            compiled.use_ortft_cache()
        rt = runtime.resolve(recipe.hardware)
        if self.name != "auto":  # else once the probe has chosen the backend (prepare)
            self._resolve_precision(self.name, rt.device)
        # DDP under torchrun: join the process group (a no-op in one process); cuda:LOCAL_RANK
        rt = dataclasses.replace(rt, device=distributed.setup(rt.device))
        self.device = rt.device
        runtime.check_optimizer(recipe.optimizer.name, rt.device)
        # DeepSpeed's accelerator (imported by a deepspeed section, or by accelerate when a
        # model loads) is this device, never its own guess: CUDA whenever a GPU is visible
        os.environ["DS_ACCELERATOR"] = rt.device.type
        world = distributed.world_size()
        if world > 1 and self._probes():
            raise InputError(
                "backend.name=auto (and backend.compile=auto) time routes in one process; "
                "under torchrun choose backend.name=ort or torch and backend.compile=true/false"
            )
        runtime.seed_everything(recipe.training.seed)
        if recipe.training.deterministic:
            runtime.make_deterministic()
        return Started(
            str(rt.device), rt.threads, rt.reason, world, distributed.summary(), heap=rt.heap
        )

    def _probes(self) -> bool:
        """backend.name=auto, or backend.compile=auto: a probe picks the route (auto.py)."""
        return self.name == "auto" or self.recipe.backend.compile == "auto"

    def _resolve_precision(self, backend: str, device: torch.device) -> None:
        requested = self.recipe.precision.dtype
        self.dtype, self.dtype_reason = runtime.resolve_precision(requested, backend, device)
        if self.dtype_reason is not None:
            log.info("precision: %s (%s)", self.dtype, self.dtype_reason)
        runtime.check_precision(self.dtype, backend, device)

    def _probe(
        self,
        loaded: LoadedRecipe,
        task: Task,
        tokenizer: Any,
        labels: Any,
        train: Encoded,
        steps: int,
    ) -> tuple[str, bool]:
        """The route the probe chose (backend, compile), its precision taken (auto.py)."""
        from ortft.backends.torch import auto

        (name, compiles), self.probe = auto.choose(
            loaded, task, tokenizer, labels, train, self.device, build_optimizer, steps
        )
        if self.name == "auto":
            self._resolve_precision(name, self.device)
        reason = auto.precision_reason(self.probe, self.dtype)
        if reason is not None:  # it weighed an alternative to the native dtype, and chose it
            self.dtype, self.dtype_reason = self.probe["dtype"], reason
            log.info("precision: %s", reason)
        return name, compiles

    def _weights(self) -> str:
        """precision.weights, with auto made concrete: the probe's choice (fp32 where none ran)."""
        weights = self.recipe.precision.weights
        if weights != "auto":
            return weights
        return self.probe["weights"] if self.probe is not None else "fp32"

    def is_main(self) -> bool:
        return distributed.is_main()

    def any_rank(self, *flags: bool) -> tuple[bool, ...]:
        return distributed.any_rank(*flags)

    def tokenizer(
        self, loaded: LoadedRecipe, run_dir: Path, task: Any, train_rows: list, labels: Any
    ) -> Any:
        """The run's tokenizer or processor, saved in the run (``preprocessors.load``)."""
        return preprocessors.load(loaded, run_dir, task, train_rows)

    # ---- prepare: model, wrapper, optimizer, schedule, resume
    def prepare(
        self,
        loaded: LoadedRecipe,
        task: Task,
        tokenizer: Any,
        labels: list[str] | None,
        train: Encoded,
        run_dir: Path,
        resume_from: Path | None,
        total_steps: int,
    ) -> TrainState:
        r, t = self.recipe, self.recipe.training
        self.task, self._tokenizer = task, tokenizer
        wrapper_name, compiles = self.name, None
        if self._probes():  # time a few steps of each route on the first batches
            wrapper_name, compiles = self._probe(
                loaded, task, tokenizer, labels, train, total_steps
            )
        # a compiled run remembers its compile's cost under this key, for a later auto probe
        key = compiled.route_key(r, self.device, self.dtype)
        self.wrapper = wrapper(wrapper_name, r.backend, compile=compiles, compile_key=key)
        # a transformers PreTrainedModel (or a family's own): its save_pretrained, peft methods
        self.model: Any = self._build_model(loaded, task, tokenizer, labels)
        self.module = models.TaskModule(self.model, task)
        self.module.to(self.device)
        self.params = [p for p in self.module.parameters() if p.requires_grad]
        self.optimizer = build_optimizer(self.params, r, self.device)
        from transformers import get_scheduler

        warmup = t.warmup_steps or int(t.warmup_ratio * total_steps)
        self.scheduler = get_scheduler(
            t.scheduler, self.optimizer, num_warmup_steps=warmup, num_training_steps=total_steps
        )
        state, ck = TrainState(), None
        if resume_from is not None:
            ck = checkpoint.load(resume_from, self.model)
            if ck.optimizer is not None:  # else DeepSpeed's engine loads them (below)
                self.optimizer.load_state_dict(ck.optimizer)
                self.scheduler.load_state_dict(ck.scheduler)
            checkpoint.set_rng_state(ck.rng)
            if isinstance(task, protocols.TrainsState):  # text-to-image: its EMA
                task.load_state_dict(ck.task_state, resume_from)
            state = ck.state
        self.micro_step = state.micro_step  # ORT's random stream follows the data position
        # precision.weights=bf16: a bf16 copy trains, built from the masters a resume loaded
        self.bf16 = master_weights.for_run(
            self._weights(), self.dtype, self.wrapper.name, self.model
        )
        trained = self.module if self.bf16 is None else models.TaskModule(self.bf16.copy, task)
        self.wrapped = self.wrapper.wrap(trained, run_dir)  # after loading: ORT shares tensors
        self.wrapped.train()
        # the fp32 model evaluates under a bf16 copy: the weights final/ will hold
        self.evaluated = self.wrapped if self.bf16 is None else self.module
        if r.deepspeed is not None:  # ZeRO 1/2 around ORTModule; the engine does DDP's job too
            from ortft.backends.torch import deepspeed

            self.deepspeed = deepspeed.start(
                self.wrapped,
                self.optimizer,
                self.scheduler,
                r,
                loaded.base_dir,
                distributed.world_size(),
                self.device,
            )
            if resume_from is not None:
                deepspeed.load_partitions(self.deepspeed, resume_from)
            self.forward: torch.nn.Module = self.deepspeed
        else:
            self.forward = distributed.wrap(self.wrapped, self.device)  # DDP around ORTModule
            outer = getattr(self.wrapper, "outer", None)  # torch.compile, around DDP
            self.forward = outer(self.forward) if outer is not None else self.forward
        # DeepSpeed runs fp16/bf16 by casting the model itself; otherwise autocast the forward
        self.amp_dtype = "fp32" if self.deepspeed is not None else self.dtype
        # fp16: loss scaling; for fp32/bf16 the scaler is disabled and each call is a no-op
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.amp_dtype == "fp16")
        amp.load_scaler_state(self.scaler, ck.scaler if ck is not None else None)
        return state

    def _build_model(self, loaded, task, tokenizer, labels) -> torch.nn.Module:
        r = self.recipe
        if isinstance(task, protocols.BuildsModel):  # the family's own (text-to-image: a UNet)
            return task.build_model(loaded, tokenizer, self.device)
        attn = self.wrapper.attn_implementation(self.device, self.dtype)
        vocab = hf_config.vocabulary(task, tokenizer)
        config = hf_config.composed_config(loaded, task, vocab)
        model = models.build_model(loaded, task.auto_class, vocab, labels, attn=attn, config=config)
        if isinstance(task, protocols.PreparesModel):
            task.prepare_model(model, tokenizer)
        self.head = load_checks.head_record(model)  # a pretrained head: kept, reordered or new
        if r.hardware.gradient_checkpointing:  # torch backend only (recipe check)
            model.gradient_checkpointing_enable()  # type: ignore[operator]
            log.info("gradient checkpointing: activations are recomputed in the backward")
        if r.adapter is not None:  # LoRA: the base is frozen, only adapter (+ head) weights train
            model = models.apply_adapter(model, r.adapter, task)
            log.info(
                "adapter: %s r=%d alpha=%g; %d of %d parameters train",
                r.adapter.kind,
                r.adapter.rank,
                r.adapter.alpha,
                models.count_parameters(model, trainable=True),
                models.count_parameters(model),
            )
        if r.backend.trainable:  # the rest is frozen (no gradient, not in the optimizer)
            models.freeze(model, r.backend.trainable)
            log.info(
                "backend.trainable: %d of %d parameters train",
                models.count_parameters(model, trainable=True),
                models.count_parameters(model),
            )
        log.info("%s", models.model_log_line(model, attn))
        if self.wrapper.name == "ort":
            log.info(
                "backend: ort (ORTModule); eager attention, since ORTModule cannot build "
                "gradients for sdpa attention"
            )
        return model

    # ---- the step
    def train_step(self, micro_batches: list[dict[str, np.ndarray]]) -> StepResult:
        """One optimizer step. The loss is the mean over the real (label-carrying) tokens of the
        whole step, over its micro-batches and processes, as the Trainer's num_items_in_batch
        does: each micro-batch's mean is weighted by its share of the step's tokens, so a short
        micro-batch does not count as much as a long one. (One row per label, as classification
        has, gives equal weights: the plain mean.)"""
        world, lr = distributed.world_size(), self.scheduler.get_last_lr()[0]
        total = max(sum(self.task.counted(b) for b in micro_batches), 1)  # over all processes
        loss_sum = torch.zeros((), device=self.device)
        scores: list[np.ndarray] = []  # ScoresOutside: each row's scores (preference: rewards)
        for batch in micro_batches:
            self.wrapper.before_forward(self.recipe.training.seed, self.micro_step)
            self.micro_step += 1
            mine = distributed.shard(batch)  # DDP: this rank's rows
            inputs = to_device(mine, self.device)
            with runtime.autocast(self.amp_dtype, self.device):  # disabled for fp32
                loss, rows = self._call(self.forward, inputs)
            if isinstance(self.task, protocols.ScoresOutside):
                scores.append(rows.float().cpu().numpy())
            share = self.task.counted(mine) / total
            if self.deepspeed is not None:  # DeepSpeed scales, accumulates, reduces gradients
                # (it divides by the accumulation steps and averages ranks itself)
                self.deepspeed.backward(loss * share * world * len(micro_batches))
                self.deepspeed.step()  # clip + optimizer + schedule at the accumulation boundary
            else:  # DDP averages the ranks' gradients: x world makes that a sum of shares
                self.scaler.scale(loss * (share * world)).backward()
                if self.bf16 is not None:  # into the fp32 masters, where micro-batches add up
                    self.bf16.collect_grads()
            self.wrapper.after_step(self.wrapped)
            loss_sum += loss.detach().float() * share
        if self.deepspeed is None:
            r = self.recipe.training
            applied = amp.optimizer_step(
                self.optimizer, self.scheduler, self.scaler, self.params, r.max_grad_norm
            )
            if self.bf16 is not None:
                self.bf16.update()
        else:
            applied = self.deepspeed.was_step_applied()
        if applied and isinstance(self.task, protocols.TrainsState):
            self.task.after_step()  # text-to-image: the EMA of the UNet's weights
        self.skipped_steps += not applied  # fp16 overflow: not an error
        # the one CPU-GPU sync per step; DDP: summed over ranks (= the global step's loss)
        loss = float(distributed.all_reduce_mean(loss_sum)) * world
        if scores:  # DDP: every rank's rows, so the step's metrics cover the global batch
            scores = [distributed.gather_rows(np.concatenate(scores))]
        metrics = self.task.metrics(loss, scores, []) if scores else {}
        metrics.pop("loss", None)
        return StepResult(loss=loss, lr=lr, applied=applied, metrics=metrics)

    # ---- eval
    def eval_mode(self, on: bool) -> None:
        self.evaluated.train(not on)

    def eval_batch(self, batch: dict[str, np.ndarray]) -> tuple[float, np.ndarray | None]:
        valid = int(batch["_valid"])
        with torch.no_grad():
            loss, logits = self._call(self.evaluated, to_device(batch, self.device))
        out = logits[:valid].float().cpu().numpy() if traits.needs_logits(self.task) else None
        return float(loss), out

    def _call(self, module: Any, inputs: dict[str, torch.Tensor]) -> tuple[Any, Any]:
        """(loss, logits) of a batch: the module's own, or the task's from the module's output
        (``ScoresOutside``: the wrapped graph stays the model's, the loss is computed here)."""
        if isinstance(self.task, protocols.RunsOutside):  # a frozen part, eager, no gradients
            inputs = self.task.outside_inputs(inputs)
        if isinstance(self.task, protocols.ScoresOutside):
            output = module(**self.task.module_inputs(inputs))
            return self.task.outside_loss(output, inputs)
        return module(**inputs)

    def extra_metrics(self, task: Any, tokenizer: Any, encoded: Any) -> dict[str, float]:
        return protocols.generated_metrics(task, self.model, tokenizer, encoded)

    # ---- files (outputs.py)
    def save(
        self, run_dir: Path, state: TrainState, recipe_yaml: str, keep_last: int
    ) -> Path | None:
        return outputs.save_checkpoint(
            run_dir,
            state,
            recipe=self.recipe,
            recipe_yaml=recipe_yaml,
            keep_last=keep_last,
            model=self.model,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            scaler=self.scaler,
            task=self.task,
            deepspeed_engine=self.deepspeed,
        )

    def checkpoint_problem(self, path: Path) -> str | None:
        return outputs.checkpoint_problem(path, self.recipe)

    def save_best(self, run_dir: Path, state: TrainState) -> None:
        if distributed.is_main():
            from ortft.checkpoint.best import save_best

            save_best(run_dir, self.model, state)

    def select_final(self, selector: Any, run_dir: Path, state: TrainState) -> None:
        selector.load_final(run_dir, self.model, state)

    def write_final(self, folder: Path) -> None:
        outputs.write_final(folder, self.model, self.task)

    def export(self, run_dir: Path, final_dir: Path, samples: Any) -> ExportReport | None:
        return outputs.export(
            run_dir,
            final_dir,
            samples,
            recipe=self.recipe,
            model=self.model,
            tokenizer=self._tokenizer,
            task=self.task,
        )

    # ---- what ran
    def parameter_counts(self) -> tuple[int, int]:
        m = self.model
        return models.count_parameters(m), models.count_parameters(m, trainable=True)

    def precision(self) -> Precision:
        auto = "auto" if self.recipe.precision.dtype == "auto" else None
        weights = "bf16" if self.bf16 is not None else "fp32"
        return Precision(self.dtype, self.skipped_steps, auto, self.dtype_reason, weights)

    def report(self) -> BackendReport:
        if self.wrapper is None:  # failed before the model was built
            return BackendReport(requested=self.name, used=self.name)
        rep = self.wrapper.report()
        if self.probe is not None:
            rep = dataclasses.replace(rep, requested=self.name)
            rep.extra["probe"] = self.probe
        if self.head is not None:
            rep.extra["head"] = self.head
        return rep

    def close(self, ok: bool) -> None:
        """The collectives are over: drop what holds the process group, then leave it."""
        if self.deepspeed is not None:
            from ortft.backends.torch import deepspeed

            deepspeed.own_storage(self.model)  # for final/ and the export
        # DDP's reducer holds the process group
        self.forward = self.deepspeed = None  # type: ignore[assignment]
        distributed.teardown()
