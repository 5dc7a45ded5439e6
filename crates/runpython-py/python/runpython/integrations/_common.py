"""What the integrations share: the import guard that names the extra, and the envelope as text."""

from __future__ import annotations

import base64
import json
from typing import Any

from runpython import Envelope


def missing(framework: str, extra: str, cause: ImportError) -> ImportError:
    """The ImportError an integration raises when its framework is not installed: it names the extra."""
    return ImportError(
        f"runpython.integrations.{extra.replace('-', '_')} needs {framework}, which is not installed: "
        f'pip install "runpython[{extra}]" ({cause})'
    )


def envelope_text(envelope: Envelope | dict[str, Any]) -> str:
    """The envelope as the model reads it: its v1 JSON, compact (images are linked by artifact id,
    never inline; they travel as the framework's own image parts)."""
    data = envelope.to_dict() if isinstance(envelope, Envelope) else envelope
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def image_bytes(envelope: Envelope) -> list[tuple[str, bytes]]:
    """The images the code displayed (within the engine's `max_image_bytes`), as (mime, bytes)."""
    return [(image["mime"], base64.b64decode(image["data"])) for image in envelope.images]
