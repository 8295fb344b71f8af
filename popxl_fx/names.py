"""Variable names for torch tensor names: any legal torch module name works.

PopXL/addons names (DotTree keys, ``NamedTensors``) need each dot-separated component to be a
python identifier or a non-negative integer; torch allows any string without a dot
(torchvision's RegNet has a submodule ``block1-0``). `escape` makes such a component an
identifier, reversibly, and `unescape` gives back the exact torch name for state dicts,
reports and errors. Names that need no escaping are unchanged.

Example:
    >>> escape("trunk_output.block1-0.proj.weight")
    'trunk_output._esc_block1_2d_0.proj.weight'
    >>> unescape(escape("a.b c.0.w"))
    'a.b c.0.w'
"""

from __future__ import annotations

__all__ = ["escape", "unescape"]

_MARK = "_esc_"


def _plain(component: str) -> bool:
    if component.startswith(_MARK):
        return False  # escaped so that unescape never misreads a real name
    return component.isidentifier() or (component.isdigit() and component.isascii())


def _escape_component(component: str) -> str:
    if _plain(component):
        return component
    # every character that is not a letter or digit (the underscore too) becomes _<hex>_
    body = "".join(
        c if c.isalnum() and c.isidentifier() or c.isdigit() else f"_{ord(c):x}_" for c in component
    )
    return _MARK + body


def _unescape_component(component: str) -> str:
    if not component.startswith(_MARK):
        return component
    parts = component[len(_MARK) :].split("_")
    # literal, hex, literal, hex, ...: escaping put every underscore around a hex code
    return "".join(p if i % 2 == 0 else chr(int(p, 16)) for i, p in enumerate(parts))


def escape(qualname: str) -> str:
    """``qualname`` (a torch parameter/buffer/module name) as a PopXL variable name."""
    return ".".join(_escape_component(c) for c in qualname.split("."))


def unescape(name: str) -> str:
    """The exact torch name of a variable name made by `escape`."""
    return ".".join(_unescape_component(c) for c in name.split("."))
