"""Requests with images, as a step sees them: made ready beside the steps, and queued by the step that finds them
ready. A projector's engine plugs in engine_proc/vision/image_intake.py's ImageIntake; a text model's engine has
NoImages, which refuses every image and imports nothing of engine_proc/vision/."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

import numpy as np

from cllm.core.protocol import ImageGrid, SeqOutput, Submit
from engine_proc.sequence import ImageSpan

NO_PROJECTOR = "this model takes no images: start it with --mmproj (a vision projector)"

# Queue a request whose images are ready, its prompt spliced with them: the output that ends it, if refused.
Queue = Callable[[Submit, np.ndarray, list[ImageSpan]], SeqOutput | None]


class Images(Protocol):
    image_tokens: int  # positions one image takes, for the frontend's count (ModelInfo)
    image_grid: ImageGrid | None

    def refuse(self, req: Submit) -> str:
        """Why the engine cannot take the request's images ("": it can)."""
        ...

    def add(self, req: Submit) -> None:
        """Make the request's images ready, beside the steps."""
        ...

    def ready(self) -> bool:
        """Requests whose images are ready wait for a step."""
        ...

    def admit(self, outputs: list[SeqOutput], queue: Queue) -> bool:
        """Queue the requests whose images are ready; those refused end in ``outputs``. Whether any was."""
        ...

    def wake_fds(self) -> tuple[int, ...]:
        """What the idle engine waits on besides requests: the signal that images are ready."""
        ...

    def pending(self) -> Iterable[int]:
        """The ids of the requests whose images are being made ready."""
        ...

    def abort(self, ids: set[int]) -> None: ...

    def close(self) -> None: ...


class NoImages:
    """A text model's: every request with images is refused at once."""

    image_tokens = 0
    image_grid: ImageGrid | None = None

    def refuse(self, req: Submit) -> str:
        return NO_PROJECTOR

    def add(self, req: Submit) -> None:
        raise AssertionError("refused")

    def ready(self) -> bool:
        return False

    def admit(self, outputs: list[SeqOutput], queue: Queue) -> bool:
        return False

    def wake_fds(self) -> tuple[int, ...]:
        return ()

    def pending(self) -> Iterable[int]:
        return ()

    def abort(self, ids: set[int]) -> None:
        pass

    def close(self) -> None:
        pass
