"""Import ``transformers`` for offline use: nothing is ever downloaded, no progress bars, errors only.

Hugging Face's libraries look for files on the Hub unless told not to; kvcli loads local folders only
(``local_files_only=True`` at every call) and also sets ``HF_HUB_OFFLINE=1`` (unless the user set it), so a
missing file is an error, never a download. Importing transformers costs 2-4 s, so kvcli does it only when a
checkpoint or tokenizer folder is named.
"""
from __future__ import annotations

import os
from types import ModuleType

from kvcli.errors import BadInputError


def transformers() -> ModuleType:
    """The ``transformers`` module, imported offline and quiet (idempotent).

    Raises:
        BadInputError: transformers is not installed (``pip install transformers tokenizers``).
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    try:
        import transformers as tf
    except ImportError as exc:
        raise BadInputError(f"Hugging Face checkpoints need transformers ({exc}); pip install transformers "
                            "tokenizers") from None
    tf.utils.logging.set_verbosity_error()
    tf.utils.logging.disable_progress_bar()
    return tf


def one_line(exc: BaseException, limit: int = 300) -> str:
    """An exception's message on one line (whitespace runs collapsed), at most ``limit`` characters."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."
