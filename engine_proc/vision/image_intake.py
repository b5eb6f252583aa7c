"""Requests with images, from their Submit to the scheduler's queue: the projector beside the model, the checks
that refuse a request at once, the encoder's thread that makes the images ready, and their pieces spliced into the
prompt as placeholder ids and image spans (engine_proc/vision/encoder.py). A projector's engine plugs it into its
steps (engine_proc/step/images.py: Images)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from cllm.core.images import ImageError
from cllm.core.protocol import SeqOutput, Submit
from engine_proc.run.model_runner import ModelLoadError, ModelRunner
from engine_proc.sequence import ImageSpan
from engine_proc.vision.encoder import Encoder, splice
from engine_proc.vision.projector import ProjectorError, Vision


class ImageIntake:
    def __init__(self, runner: ModelRunner, mmproj: str, n_threads: int):
        """The projector (--mmproj) loaded beside the model; ModelLoadError saying why it cannot serve (the runner
        is closed then)."""
        self.runner = runner
        try:
            self.vision = Vision(runner.model, mmproj, n_threads, use_gpu=runner.info.gpu_layers > 0)
        except ProjectorError as e:
            runner.close()
            raise ModelLoadError(str(e)) from None
        runner.positions_lag(self.vision.mrope)
        try:
            # the tokens one image takes, or its begin/end text's and the grid the rest follows (Vision.image_sizing)
            self.image_tokens, self.image_grid = self.vision.image_sizing()
            if why := self.vision.batch_error(runner.n_ubatch):
                raise ProjectorError(why)
        except ProjectorError as e:
            self.vision.close()
            runner.close()
            raise ModelLoadError(f"{mmproj}: {e}") from None
        self.encoder = Encoder(self.vision)

    def refuse(self, req: Submit) -> str:
        """Why the engine cannot take the request's images ("": it can). The frontend checks these first."""
        ats = [i.at for i in req.images]
        if req.sampling.prompt_logprobs is not None:  # they would score the placeholders of an image's positions
            return "prompt logprobs are not available for a prompt with images"
        if ats != sorted(ats) or not 0 <= ats[0] <= ats[-1] <= len(req.prompt):
            return "the images' places are out of the prompt's order or range"
        return ""

    def add(self, req: Submit) -> None:
        self.encoder.add(req)

    def ready(self) -> bool:
        return bool(self.encoder.pending) and self.encoder.ready()

    def wake_fds(self) -> tuple[int, ...]:
        return (self.encoder.armed(),)

    def pending(self) -> Iterable[int]:
        return self.encoder.pending

    def abort(self, ids: set[int]) -> None:
        self.encoder.abort(ids)

    def admit(
        self, outputs: list[SeqOutput], queue: Callable[[Submit, np.ndarray, list[ImageSpan]], SeqOutput | None]
    ) -> bool:
        """Queue the requests whose images the encoder made ready, each with its prompt and image spans; those it
        could not make (a malformed image), and those ``queue`` refuses, end in ``outputs``. Whether any did."""
        if not self.encoder.pending:
            return False
        refused, made = len(outputs), []
        for req, pieces in self.encoder.take():
            if isinstance(pieces, BaseException):  # an ImageError's message names the problem; mtmd's codes do not
                why = str(pieces) if isinstance(pieces, ImageError) else f"the image could not be encoded ({pieces})"
                outputs.append(SeqOutput(req.id, finish="error", error=why))
                continue
            prompt, spans = splice(req.prompt, req.images, pieces, self.runner.n_vocab, self.vision.non_causal)
            if len(prompt) >= self.runner.seq_ctx:  # the frontend counted each image's tokens: not expected
                why = f"the prompt with its images takes {len(prompt)} tokens, over the {self.runner.seq_ctx - 1} "
                outputs.append(SeqOutput(req.id, finish="error", error=why + "a sequence may"))
                continue
            made.append((req, prompt, spans))
        for req, prompt, spans in made:
            if (error := queue(req, prompt, spans)) is not None:
                outputs.append(error)
        return len(outputs) > refused

    def close(self) -> None:
        self.encoder.close()
        self.vision.close()
