"""SchemeFamily: everything the rest of the code asks of a watermark scheme family, each hook declared here
with its default. A family is one module of this package (and one line of the registry, ``__init__.py``).

What a family says:

* its spec: the spec type that parses and prints its spec strings (``spec_type.parse`` / ``spec.format``),
  the prefix it claims (``claims``), and its one name (``name``: the specs' ``kind``; ``old_names`` are the
  spellings still taken for one release);
* how it watermarks: ``make`` binds a spec to its key material; ``sampling`` False: the watermark biases the
  logits (generation's stage 5), True: it chooses the token (stage 8, ``choose``); what generation cannot do
  with it (``generation_refusal``, ``deterministic_choice``, ``committed_context_only``, ``context_memory``);
* how it is scored: green lists (``green_list``: ``detector.scoring``) or per-position values
  (``score_counted``, ``window_p_values``, ``reference_unit_z``), whether units common in human text are left
  out (``common_units_as``), where scored positions start (``scores_every_token``);
* what its verdict carries: ``statistic`` and ``explanation_field`` (sampling families), the spoof check
  (``spoof_check`` / ``spoof_judged``), two-part keys (``two_part``), a C2PA soft binding (``soft_binding``).
"""

from __future__ import annotations

from collections.abc import Callable


class SchemeFamily:
    name: str = ""  # the one spelling: every spec of the family has this ``kind``
    old_names: tuple[str, ...] = ()  # earlier spellings, taken for one release with a DeprecationWarning
    prefix: str = ""  # the spec strings' prefix (``kgw``, ``hf``, ``vllm``, ...)
    tag: str | None = None  # a first field that must follow the prefix (``hf:synthid,...``), if any
    spec_type: type = object  # parses (``parse``) and prints (``format``) the family's spec strings
    example: str = ""  # one spec string, for messages and documentation
    needs_key: bool = True  # keyed by a keyring key (False: the spec carries public keys)

    # ---- generation
    sampling: bool = False  # the watermark chooses the token (True) or biases the logits (False)
    generation_refusal: str | None = None  # why text under it is not generated here (None: it is)
    deterministic_choice: bool = False  # the choice is a function of context and distribution alone
    committed_context_only: bool = False  # contexts follow committed tokens only (no drafted positions)
    context_memory: type | None = None  # a per-sequence context rule of its own: ``cls(mark, prompt_len)``
    evaluation_preset: str | None = None  # the spec ``eval robustness --schemes NAME`` runs (None: none)

    # ---- detection and the verdict
    green_list: bool = False  # colours tokens green / red, scored by G of T (detector.scoring)
    scores_every_token: bool = False  # scored positions start at token 0 (contexts padded), not at token h
    two_part: bool = False  # a key may publish a detection half (watermark.public_key)
    soft_binding: bool = False  # a C2PA manifest's soft binding may name it (api.detector.routes_resolution)
    spoof_check: bool = False  # positive verdicts get the spoof check (detector.spoof_check)
    spoof_judged: bool = False  # that check has measured power, so it says ``spoof_suspected``
    explanation_field: str = "green"  # the per-token value an explanation shows

    def claims(self, prefix: str, first_field: str | None) -> bool:
        """Whether a spec string with this prefix (and first field) is this family's."""
        return prefix == self.prefix and (self.tag is None or first_field == self.tag)

    def parse(self, text: str):
        return self.spec_type.parse(text)

    def make(self, spec, secret: bytes | None, vocab_size: int, key_id: str | None = None,
             public_half: bytes | None = None):
        """The watermark of ``spec`` under ``secret`` (None for a family whose spec carries its keys)."""
        raise NotImplementedError(f"{self.name}: no watermark constructor")

    def common_units_as(self, spec) -> str | None:
        """The KGW context scheme whose common-unit threshold this spec's units take (``detector.common_units``);
        None: every position counts, as the reference detector it reproduces counts them."""
        return None

    def label(self, spec) -> str:
        """A short name for plots and file names."""
        return f"{self.name.replace(':', '-')}-h{spec.context_width}"

    # ---- sampling families: what a position is worth, and how a token is chosen
    def score_counted(self, mark, counted):
        """(statistic, z, p, extras) of the counted positions' values (``watermark.schemes.sampling``)."""
        raise NotImplementedError(f"{self.name} is not scored by position values")

    def window_p_values(self, mark, sums, counts):
        raise NotImplementedError(f"{self.name} is not scored by position values")

    def reference_unit_z(self, mark) -> float:
        raise NotImplementedError(f"{self.name} is not scored by position values")

    def statistic(self, mark, score) -> dict | None:
        return None

    def choose(self, mark, probs, context, ids, generators, draw: Callable):
        """The tokens of rows ``probs`` [R, V] (or [R, C] over ``ids``) sharing ``mark``; ``draw(probs, generators)``
        is the pipeline's own draw."""
        raise TypeError(f"{self.name} biases the logits; it does not choose tokens")
