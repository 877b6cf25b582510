"""text-to-image as the core sees it: the task (``task.TextToImage``) with the protocols of
``ortft.tasks.protocols`` it implements: its recipe rules, its tokenizer, the Stable Diffusion
it builds and saves (``diffusion``), the validation images it draws as it trains, the folders
eval, predict and ``ortft export`` hand it (``eval_loss``, ``graphs``) and ``ortft predict
--prompt`` (``draw``). Each hook imports torch or diffusers lazily, so building the task for
``ortft validate`` stays torch-free."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ortft.core.reports import Drawing, EvalResult, ExportReport
from ortft.families.text_to_image.task import Options, TextToImage

ARCHITECTURE = "stable-diffusion"  # model.from_config.architecture (a tiny SD)


class StableDiffusion(TextToImage):
    """``TextToImage`` with the protocol hooks the core calls; it keeps the parts it builds."""

    def __init__(self, options: Options) -> None:
        super().__init__(options)
        self.parts: Any = None  # the Stable Diffusion's parts (``diffusion.Parts``), once built
        self.unet: Any = None  # the UNet that trains (``build_model``)

    def recipe_problems(self, recipe: Any) -> Iterator[str]:
        """The tokenizer is the model folder's (from_config: a character-level CLIP one)."""
        tok = recipe.model.tokenizer
        if tok.path or tok.train:
            yield (
                f"model.tokenizer: {recipe.task.name} uses the model folder's tokenizer/ "
                "(from_config: a character-level CLIP tokenizer); remove model.tokenizer"
            )

    def model_problems(self, recipe: Any) -> Iterator[str]:
        """A from_config model is a tiny Stable Diffusion; the UNet trains on ort or torch,
        or the one backend.name=auto's probe times faster (eager: its compiled route is
        untried on a UNet); the EMA follows a full fine-tune and is what final/ holds."""
        fc, name = recipe.model.from_config, recipe.task.name
        if fc is not None and fc.architecture != ARCHITECTURE:
            yield (
                f"model.from_config.architecture={fc.architecture}: {name} builds a tiny Stable "
                f"Diffusion from a config; set architecture: {ARCHITECTURE}"
            )
        ema = getattr(recipe.task, "ema_decay", None) is not None
        if recipe.adapter is not None and ema:
            yield "task.ema_decay with adapter: the EMA follows a full fine-tune's UNet; remove one"
        if ema and recipe.checkpoint.final == "best":
            # final/ is the EMA (diffusers' script saves it), the best step is the live weights'
            yield (
                "checkpoint.final=best with task.ema_decay: final/ holds the EMA weights, but the "
                "best step is picked on the live weights' eval loss; use checkpoint.final=last"
            )
        if recipe.backend.compile == "auto":
            yield (
                "backend.compile=auto: text-to-image's probe (backend.name=auto) times the eager "
                "routes only; set backend.compile true or false"
            )

    def load_tokenizer(self, loaded: Any, run_dir: Path) -> Any:
        """The model folder's CLIP ``tokenizer/``, or a from_config model's character one."""
        from ortft.families.text_to_image import diffusion

        return diffusion.run_tokenizer(loaded, run_dir)

    def build_model(self, loaded: Any, tokenizer: Any, device: Any) -> Any:
        """The UNet; the frozen VAE and text encoder are bound to the task (``bind_frozen``),
        the parts kept for drawing and for final/."""
        from ortft.families.text_to_image import diffusion

        self.parts, self.unet = diffusion.build(loaded, self, tokenizer, device)
        return self.unet

    def save_final(self, folder: Path, model: Any) -> None:
        """A diffusers folder (the EMA's weights with task.ema_decay; a LoRA's in lora/)."""
        from ortft.families.text_to_image import diffusion

        diffusion.save_final(folder, model, self.parts, ema=self.ema)

    def draw_validation(self, folder: Path, seed: int) -> int:
        """The validation prompts drawn on the main process (``diffusion.draw_validation``)."""
        if self.parts is None:  # nothing built here (an engine that builds no parts)
            return 0
        from ortft.backends.torch import distributed

        if not distributed.is_main():
            return 0
        from ortft.families.text_to_image import diffusion

        return diffusion.draw_validation(self.parts, self.unet, self, folder, seed)

    def owns_folder(self, folder: Path) -> bool:
        """A diffusers folder (a run's final/, a model folder, an export): model_index.json."""
        return (folder / "model_index.json").is_file()

    def open_problem(self, source: Path) -> str:
        return (
            f"{source}: a text-to-image (diffusers) model: it draws with "
            "`ortft predict SOURCE --prompt TEXT -o out.png`; `ortft eval SOURCE` scores it"
        )

    def evaluate_folder(self, source: Path, data_file: Path | None, batch_size: int) -> EvalResult:
        """The diffusion eval loss (``eval_loss``)."""
        from ortft.families.text_to_image import eval_loss

        return eval_loss.run(source, data_file, batch_size)

    def export_folder(
        self,
        folder: Path,
        out_dir: Path,
        opset: int,
        tolerance: float,
        weights: Path | None = None,
        flags: Sequence[str] = (),
    ) -> ExportReport:
        """The four graphs of ``graphs`` from the folder, its LoRA fused. A checkpoint holds the
        UNet alone, and every flag is refused: the export is fp32 graphs, the LoRA always fused
        (a diffusers folder has no unmerged graph to write)."""
        from ortft.core.errors import InputError
        from ortft.families.text_to_image import graphs

        if weights is not None and weights != folder:
            raise InputError(
                f"{weights}: a text-to-image checkpoint holds the UNet's weights alone; "
                "export the run (its final/) or resume it to the end"
            )
        if flags:
            raise InputError(
                f"{flags[0]}: not for a text-to-image model (its export is fp32 graphs)"
            )
        pipe = graphs.load_pipeline(folder, fuse=True)
        return graphs.export(pipe, out_dir, opset, tolerance)

    def draw(self, source: Path, options: dict[str, Any], output: Path) -> Drawing:
        """One image (``draw.draw``: diffusers' pipeline, or the export's numpy loop)."""
        from ortft.families.text_to_image import draw

        return draw.draw(source, draw.DrawOptions(**options), output)


def build(options: Options) -> StableDiffusion:
    return StableDiffusion(options)
