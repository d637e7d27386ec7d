"""Token bytes to confirmed text: UTF-8 safe, with stop strings held back until decided.

Byte-level BPE can split one character across tokens, so bytes go through an incremental UTF-8
decoder (an incomplete character waits for its next bytes instead of showing U+FFFD). Text that
could be the start of a stop string is held back until it is clearly not one. The engine pushes
only committed tokens, so a draft rejected in the middle of a character never shows. When
generation ends inside a character, :meth:`TextStream.flush` shows its bytes as one U+FFFD
(the bytes are not dropped silently).
"""

from __future__ import annotations

import codecs
from typing import Sequence


class TextStream:
    """Feed token bytes in order; get back text that is final."""

    def __init__(self, stop: Sequence[str] = ()) -> None:
        self._pending = b""  #: the start of a character whose bytes have not all come
        self._stop = [s for s in stop if s]
        self._held = ""
        self.stopped = False  #: a stop string was found; nothing more will be emitted

    def push(self, data: bytes) -> str:
        """Add one token's bytes; return the text that became final."""
        if not self._stop:  # nothing to hold back (and never stopped): the common case
            return self._decode(data)
        if self.stopped:
            return ""
        return self._release(self._held + self._decode(data))

    def _decode(self, data: bytes, final: bool = False) -> str:
        """Incremental UTF-8: what ``codecs``' incremental decoder does, without its Python
        frame (a token's text is made between two decodes, where every call is dear)."""
        if self._pending:
            data = self._pending + data
        text, used = codecs.utf_8_decode(data, "replace", final)
        self._pending = data[used:]
        return text

    def flush(self) -> str:
        """End of generation: release everything still held (incomplete bytes become U+FFFD)."""
        if self.stopped:
            return ""
        text = self._held + self._decode(b"", final=True)
        self._held = ""
        return text

    def _release(self, text: str) -> str:
        cut = min((i for i in (text.find(s) for s in self._stop) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            self._held = ""
            return text[:cut]
        keep = _longest_stop_prefix_suffix(text, self._stop)
        self._held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]


def _longest_stop_prefix_suffix(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of some stop string."""
    best = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:n]):
                best = n
                break
    return best
