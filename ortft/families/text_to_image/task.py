"""text-to-image: fine-tune a Stable Diffusion UNet on captioned images, as diffusers'
``train_text_to_image.py`` does (and its LoRA variant, with ``adapter:``).

Rows name an image file (``data.image_column``) and its caption (``data.text_column``), from a
JSONL/CSV file or a folder's metadata file; or a folder of class sub-folders, each image captioned
by ``task.caption_template`` from its label (``"a photo of {label}"``). ``encode`` checks every
image once (``ortft.data.images``, with ``data.on_bad_file``) and tokenizes its caption.

``collate`` makes a batch what the UNet trains on, each row drawn from a generator seeded by
(``training.seed``, the epoch, the row), so a batch is the same however batches fall and a resumed
run draws what the uninterrupted one drew:
1. the image resized (shorter side to ``resolution``, bilinear), cropped to a square (centre, or
   at a random place), maybe mirrored, scaled to [-1, 1];
2. latents from the frozen VAE: its mean + std x noise, times its scaling factor;
3. the caption's hidden states from the frozen text encoder (the empty caption for a
   ``caption_dropout`` share of train rows: what classifier-free guidance needs);
4. a timestep drawn uniformly, noise, the noisy latents (DDPM's forward process on the model's
   schedule) and the target: the noise (epsilon prediction) or the velocity (v prediction);
5. with ``snr_gamma``, the min-SNR weight of each row (Hang et al. 2023, as diffusers computes it).
The forward is the UNet and the (weighted) MSE loss alone: the part ORTModule trains. Eval batches
(no epoch) draw from a fixed stream, so the eval loss is deterministic.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field, model_validator

from ortft.core.constants import IGNORE_INDEX
from ortft.core.errors import InputError
from ortft.data import images
from ortft.tasks.base import Encoded, Task, TaskOptions, skip_bad_file

PATH, ROW, IDS = "_image", "_row", "_ids"  # "_": never fed to the model
EVAL_EPOCH = 2**31 - 1  # eval rows' stream: no train epoch reaches it
Share = Annotated[float, Field(ge=0.0, lt=1.0)]


class Options(TaskOptions):
    name: Literal["text-to-image"] = "text-to-image"
    caption_template: str | None = Field(
        None,
        description="Caption each image from its label, e.g. 'a photo of {label}' (a folder of "
        "class sub-folders, or data.label_column of a file); default: data.text_column holds "
        "the caption.",
    )
    resolution: Annotated[int, Field(ge=8, le=2048)] = Field(
        512,
        description="Images are resized (shorter side, bilinear) and cropped to this square; a "
        "multiple of 8.",
    )
    center_crop: bool = Field(
        False, description="Crop the centre (else a random square of each train image, seeded)."
    )
    random_flip: bool = Field(
        False, description="Mirror half the train images left to right (seeded)."
    )
    caption_dropout: Share = Field(
        0.0,
        description="Share of train captions replaced by the empty caption, so that the model "
        "also learns the unconditional prediction classifier-free guidance needs (0.1 is usual).",
    )
    snr_gamma: Annotated[float, Field(gt=0.0)] | None = Field(
        None,
        description="Min-SNR loss weighting (Hang et al. 2023): each row's loss times "
        "min(SNR, gamma) / SNR (v prediction: / (SNR + 1)); 5.0 is the paper's. Default: plain MSE.",
    )
    ema_decay: Annotated[float, Field(gt=0.0, lt=1.0)] | None = Field(
        None,
        description="Keep an exponential moving average of the UNet's weights (diffusers' "
        "EMAModel, --use_ema: decay min(ema_decay, (1 + step) / (10 + step))); final/ holds "
        "the averaged weights, checkpoints both. 0.9999 is diffusers' default. Not with LoRA.",
    )
    prediction_type: Literal["epsilon", "v_prediction"] | None = Field(
        None,
        description="What the UNet predicts: the noise (epsilon) or the velocity (v_prediction); "
        "default: the model's scheduler config (from_config: epsilon).",
    )

    validation_prompts: list[str] = Field(
        default_factory=list,
        description="Prompts drawn every task.validation_every steps (and at the last) with the "
        "weights as they are (the EMA's with task.ema_decay), one PNG each in "
        "<run>/validation/step-NNNNNN/, seeded by training.seed.",
    )
    validation_every: Annotated[int, Field(ge=1)] = Field(
        100, description="Steps between validation drawings (task.validation_prompts)."
    )
    validation_steps: Annotated[int, Field(ge=1, le=1000)] = Field(
        20, description="Denoising steps of each validation drawing (the model's scheduler)."
    )

    @model_validator(mode="after")
    def _sizes(self) -> Options:
        if self.resolution % 8:
            raise ValueError(f"task.resolution={self.resolution} must be a multiple of 8")
        if self.caption_template is not None and "{label}" not in self.caption_template:
            raise ValueError("task.caption_template must contain {label}")
        return self


class TextToImage(Task):
    name = "text-to-image"
    modality = "text-image"
    auto_class = ""
    row_local = False  # each row's random stream is keyed by its position in the split
    export_kind = "text-to-image"
    aligned_keys = ()  # caption ids are fixed length; nothing is cut
    eval_metrics = ("eval_loss",)

    @property
    def main_input(self) -> str:
        return "noisy_latents"

    def __init__(self, options: Options) -> None:
        self.options = options
        self.frozen: Any = None  # the frozen VAE + text encoder (``bind_frozen``)
        self.alphas: np.ndarray | None = None  # the training schedule's cumulative alphas
        self.prediction: str = options.prediction_type or "epsilon"
        self.empty_ids: np.ndarray | None = None  # the empty caption's ids (caption dropout)
        self.ema: Any = None  # diffusers' EMAModel of the UNet's weights (task.ema_decay)
        self._trained: list[Any] = []  # the parameters the EMA follows

    @property
    def options_key(self) -> str:
        return self.options.caption_template or ""

    @property
    def validation_prompts(self) -> list[str]:
        return self.options.validation_prompts

    @property
    def validation_every(self) -> int | None:
        return self.options.validation_every if self.options.validation_prompts else None

    def _caption_column(self, data) -> str:
        return data.label_column if self.options.caption_template else data.text_column

    def columns(self, data) -> list[str]:
        return [data.image_column, self._caption_column(data)]

    def file_column(self, data) -> str | None:
        return data.image_column

    def texts(self, rows, data) -> list[str]:
        return [self.caption(row, data) for row in rows]

    def caption(self, row: dict[str, Any], data) -> str:
        value = row[self._caption_column(data)]
        template = self.options.caption_template
        return template.format(label=value) if template else str(value or "")

    def bind(self, processor: Any) -> None:
        """The CLIP tokenizer: the empty caption's ids, for caption dropout."""
        self.empty_ids = _ids(processor, [""])[0]

    def bind_frozen(self, frozen: Any, alphas: np.ndarray, prediction: str, unet: Any) -> None:
        """The frozen encoders (``ortft.families.text_to_image.diffusion.Frozen``), the
        schedule's cumulative alphas, the prediction type (the task option, else the
        scheduler's) and the UNet that trains (its EMA starts from its weights)."""
        self.frozen, self.alphas = frozen, alphas
        self.prediction = self.options.prediction_type or prediction
        if self.options.ema_decay is not None:
            from diffusers.training_utils import EMAModel

            self._trained = [p for p in unet.parameters() if p.requires_grad]
            self.ema = EMAModel(self._trained, decay=self.options.ema_decay)

    def after_step(self) -> None:
        if self.ema is not None:
            self.ema.step(self._trained)

    def state_dict(self) -> dict[str, Any] | None:
        return {"ema": self.ema.state_dict()} if self.ema is not None else None

    def load_state_dict(self, state, path) -> None:
        if self.ema is None:
            return
        if not state or "ema" not in state:
            raise InputError(
                f"{path}: the checkpoint has no EMA weights, and task.ema_decay asks for them "
                "(it was written without task.ema_decay)"
            )
        self.ema.load_state_dict(state["ema"])

    def encode(self, rows, tokenizer, data, label2id) -> Encoded:
        paths, captions, kept = [], [], []
        for i, row in enumerate(rows):
            path = row[data.image_column]
            if not isinstance(path, str):
                raise InputError(
                    f"row {i + 1}: data.image_column '{data.image_column}' holds a "
                    f"{type(path).__name__}, not an image file path"
                )
            try:
                images.check(path)
            except images.BadImage as err:
                skip_bad_file(data, i + 1, path, err)
                continue
            paths.append(path.encode())
            captions.append(self.caption(row, data))
            kept.append(i)
        ids = _ids(tokenizer, captions) if captions else np.zeros((0, 1), dtype=np.int64)
        return Encoded(
            {
                PATH: np.array(paths, dtype="S") if paths else np.zeros(0, dtype="S1"),
                ROW: np.array(kept, dtype=np.int64),
                IDS: ids,
                # 1 per row: eval's padded copies get -100 (batches.eval_batches) and weigh 0
                "labels": np.ones(len(kept), dtype=np.int64),
            }
        )

    def collate(self, batch, epoch, seed) -> dict[str, np.ndarray]:
        if self.frozen is None or self.alphas is None:
            raise RuntimeError("text-to-image: collate before bind_frozen")
        o, train = self.options, epoch is not None
        rngs = [
            np.random.default_rng([seed, EVAL_EPOCH if epoch is None else epoch, int(r)])
            for r in batch[ROW]
        ]
        pixels = np.stack(
            [
                self._pixels(raw.decode(), rng, train)
                for raw, rng in zip(batch[PATH], rngs, strict=True)
            ]
        )
        mean, std = self.frozen.latent_moments(pixels)
        ids = batch[IDS].copy()
        if train and o.caption_dropout:
            for i, rng in enumerate(rngs):
                if rng.random() < o.caption_dropout:
                    ids[i] = self.empty_ids
        hidden = self.frozen.hidden_states(ids)
        steps = len(self.alphas)
        t = np.array([rng.integers(0, steps) for rng in rngs], dtype=np.int64)
        noise = np.stack([rng.standard_normal(mean.shape[1:]) for rng in rngs])
        eps = np.stack([rng.standard_normal(mean.shape[1:]) for rng in rngs])
        latents = mean + std * eps
        a = np.sqrt(self.alphas[t]).reshape(-1, 1, 1, 1)
        b = np.sqrt(1.0 - self.alphas[t]).reshape(-1, 1, 1, 1)
        target = noise if self.prediction == "epsilon" else a * noise - b * latents
        return {
            **batch,
            "noisy_latents": (a * latents + b * noise).astype(np.float32),
            "timesteps": t,
            "encoder_hidden_states": hidden.astype(np.float32),
            "target": target.astype(np.float32),
            "weight": self.snr_weights(t),
        }

    def snr_weights(self, t: np.ndarray) -> np.ndarray:
        """Each row's loss weight: 1, or min-SNR's min(SNR, gamma) / SNR (epsilon) or
        min(SNR, gamma) / (SNR + 1) (v prediction), SNR = alpha_bar / (1 - alpha_bar)."""
        gamma = self.options.snr_gamma
        if gamma is None:
            return np.ones(len(t), dtype=np.float32)
        assert self.alphas is not None, "bind_frozen sets the schedule before training"
        alpha = self.alphas[t]
        snr = alpha / (1.0 - alpha)
        clipped = np.minimum(snr, gamma)
        weight = clipped / snr if self.prediction == "epsilon" else clipped / (snr + 1.0)
        return weight.astype(np.float32)

    def _pixels(self, path: str, rng: np.random.Generator, train: bool) -> np.ndarray:
        """[3, R, R] float32 in [-1, 1]: resized, cropped, maybe mirrored (train rows)."""
        o, size = self.options, self.options.resolution
        try:
            img = images.load(path)
        except images.BadImage as err:
            raise InputError(f"{path}: {err} (the file changed since it was checked)") from None
        img = images.resize_shorter(img, size)
        width, height = img.size
        if o.center_crop or not train:
            left, top = (width - size) // 2, (height - size) // 2
        else:
            left = int(rng.integers(0, width - size + 1))
            top = int(rng.integers(0, height - size + 1))
        img = img.crop((left, top, left + size, top + size))
        if train and o.random_flip and rng.random() < 0.5:
            img = images.hflip(img)
        arr = np.asarray(img, dtype=np.float32).transpose(2, 0, 1)
        return arr / 127.5 - 1.0

    def forward(  # type: ignore[override]  # a modality's forward takes its own inputs
        self,
        model,
        noisy_latents,
        timesteps,
        encoder_hidden_states,
        target,
        weight,
        labels,
        **extra,
    ) -> tuple[Any, Any]:
        """The UNet's prediction against the target: each row's mean squared error times its
        weight, averaged over the real rows (labels 1; eval's padded copies -100)."""
        pred = model(noisy_latents, timesteps, encoder_hidden_states, return_dict=False)[0]
        per_row = ((pred.float() - target.float()) ** 2).mean(dim=(1, 2, 3))
        real = (labels != IGNORE_INDEX).float()
        loss = (per_row * weight * real).sum() / real.sum().clamp(min=1.0)
        return loss, per_row.detach()

    def metrics(self, loss, logits, labels) -> dict[str, Any]:
        return {"loss": loss}


def _ids(tokenizer: Any, captions: list[str]) -> np.ndarray:
    """Caption ids padded to the tokenizer's length (Stable Diffusion pads every caption to 77)."""
    out = tokenizer(
        captions,
        padding="max_length",
        max_length=tokenizer.model_max_length,
        truncation=True,
        return_tensors="np",
    )
    return np.asarray(out["input_ids"], dtype=np.int64)
