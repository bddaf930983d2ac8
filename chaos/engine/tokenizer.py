"""Byte-level tokenizer: token id = UTF-8 byte value (0-255) plus three specials.

Ids 256 (BOS), 257 (EOS) and 258 (PAD) are specials; the model's vocabulary may be larger,
and ids above 258 render as ``<|id|>`` in text.
"""

from __future__ import annotations

BOS_ID = 256
EOS_ID = 257
PAD_ID = 258
NUM_BYTE_TOKENS = 256


class ByteTokenizer:
    """Encode text to UTF-8 byte ids; decode ids back to text."""

    eos_token_id = EOS_ID
    bos_token_id = BOS_ID

    def encode(self, text: str) -> list[int]:
        """Text -> token ids, one per UTF-8 byte (no BOS added).

        Args:
            text: any string.

        Returns:
            ids in [0, 256).
        """
        return list(text.encode("utf-8"))

    def token_text(self, token_id: int) -> str:
        """The text of one token (a lone byte of a multi-byte character renders as U+FFFD)."""
        if token_id < NUM_BYTE_TOKENS:
            return bytes([token_id]).decode("utf-8", errors="replace")
        return {BOS_ID: "<|bos|>", EOS_ID: "<|eos|>", PAD_ID: "<|pad|>"}.get(
            token_id, f"<|{token_id}|>")

    def decode(self, ids: list[int]) -> str:
        """Token ids -> text; byte runs decode as UTF-8 (invalid bytes become U+FFFD).

        Args:
            ids: token ids.

        Returns:
            the text.
        """
        out: list[str] = []
        run: list[int] = []
        for t in ids:
            if t < NUM_BYTE_TOKENS:
                run.append(t)
                continue
            if run:
                out.append(bytes(run).decode("utf-8", errors="replace"))
                run = []
            out.append(self.token_text(t))
        if run:
            out.append(bytes(run).decode("utf-8", errors="replace"))
        return "".join(out)
