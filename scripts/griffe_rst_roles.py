"""A griffe extension for the API reference (``make docs``): the code's docstrings cross-reference with reST roles
(``:class:`~.store.Store```, ``:meth:`step```, ``:mod:`.verdicts```), which Markdown would print as they are.
Each role becomes an autorefs cross-reference to the object's full path, resolved the way the roles are written
here (a leading dot: relative to the docstring's package; a bare name: the class, then the module, then the
package it sits in; ``~``: show the last part only). It is marked optional: a target the site renders becomes a
link, any other (a private helper, a module with no page) its name in code, never a broken link.

mkdocs.yml names this file under the Python handler's ``extensions``; ``tests/docs/test_docs_site.py`` checks that
no raw role reaches the built site.
"""

from __future__ import annotations

import html
import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:class|meth|func|mod|data|attr|exc|obj|const):`(?P<text>[^`]+)`")
_TITLED = re.compile(r"^(?P<title>.+?)\s*<(?P<target>[^>]+)>$")


def _package_of(obj: griffe.Object) -> str:
    """The package a docstring's relative names start from: a module's parent package (a package's own)."""
    module = obj if obj.is_module else obj.module
    path = module.path
    return path if getattr(module, "is_package", False) else path.rpartition(".")[0]


def _candidates(obj: griffe.Object, target: str) -> list[str]:
    if target.startswith("."):
        dots = len(target) - len(target.lstrip("."))
        base = _package_of(obj)
        for _ in range(dots - 1):
            base = base.rpartition(".")[0]
        return [f"{base}.{target[dots:]}"]
    scopes = []
    here: griffe.Object | None = obj
    while here is not None:  # the object itself (a method's siblings), its class, its module
        scopes.append(here.path)
        here = here.parent
    return [target, *(f"{scope}.{target}" for scope in scopes), f"{_package_of(obj)}.{target}"]


def _resolve(obj: griffe.Object, target: str) -> str:
    collection = obj.modules_collection
    for path in _candidates(obj, target):
        try:
            collection.get_member(path)
        except (KeyError, ValueError, AttributeError, griffe.AliasResolutionError, griffe.CyclicAliasError):
            continue
        return path
    return _candidates(obj, target)[0] if target.startswith(".") else target


def _replace(obj: griffe.Object, match: re.Match[str]) -> str:
    text = match["text"].strip()
    titled = _TITLED.match(text)
    title, target = (titled["title"], titled["target"]) if titled else (None, text)
    short = target.startswith("~")
    target = target.lstrip("~")
    path = _resolve(obj, target)
    shown = title or (target.rpartition(".")[2] if short else target.lstrip("."))
    return f'<autoref identifier="{html.escape(path)}" optional><code>{html.escape(shown)}</code></autoref>'


class RstRoles(griffe.Extension):
    """Rewrite reST roles in every docstring of the loaded packages into optional autorefs cross-references."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        self._walk(pkg, set())

    def _walk(self, obj: griffe.Object, seen: set[str]) -> None:
        if obj.path in seen:
            return
        seen.add(obj.path)
        if obj.docstring is not None and ":" in obj.docstring.value:
            obj.docstring.value = _ROLE.sub(lambda m: _replace(obj, m), obj.docstring.value)
        for member in obj.members.values():
            if not member.is_alias:
                self._walk(member, seen)
