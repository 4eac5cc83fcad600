"""What an answer may use: the static half of "a check tests the skill it names".

An exercise's answer is Python source (the answer cell). Before anything runs, ``review`` reads it
(``ast``; nothing is executed) and refuses, with a reason the student can act on:

- a syntax error, or an answer that does not define the function (or class) the exercise asks for;
- an import the exercise does not allow -- always ``parallel_lab`` itself: the library's own
  implementation of what the exercise asks for is not an answer;
- a ``torch.distributed`` function the exercise does not allow (``dist.all_reduce`` in a ring
  all-reduce built from send/recv);
- reflection, which would reach around the first two rules: ``getattr``/``setattr``/``eval``/
  ``exec``/``__import__``/``globals``..., and any ``__dunder__`` attribute;
- changing a module (``torch.equal = ...``): an answer computes, it does not patch torch or the
  library.

The dynamic half runs on the ranks (``commlog`` records what the code really sent) and in the
checking process (every comparison with the reference). Static review alone can be fooled; with the
sandbox around it and the comparison out of reach it does not need to be perfect, only clear.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from parallel_lab.i18n import _

REFLECTION = ("getattr", "setattr", "delattr", "globals", "locals", "vars", "eval", "exec", "compile",
              "__import__", "breakpoint", "open", "input", "memoryview")
TORCH_DIST = "torch.distributed"


@dataclass(frozen=True)
class Policy:
    """What one exercise's answer may use.

    name:     the function or class the answer must define
    imports:  modules it may import (and their submodules); ``torch`` and ``torch.distributed`` are
              in scope already as ``torch`` and ``dist``
    dist:     ``torch.distributed`` attributes it may use (None: any; () : none at all)
    builds:   what the exercise builds, for the reason of a refused collective ("this exercise builds
              it from isend/recv")
    reflection: skip the reflection and patching rules (the sandbox's own tests probe it with code
              that does what no exercise allows)
    forbidden: names of torch functions (or methods) that would do the exercise's work for it
              (``softmax`` in a log-sum-exp merge), refused wherever they appear; ``forbidden_why``
              says what to write instead
    """

    name: str
    imports: tuple[str, ...] = ("torch", "torch.distributed", "math")
    dist: tuple[str, ...] | None = None
    builds: str = ""
    reflection: bool = False  # True only for probes of the sandbox itself (tests)
    forbidden: tuple[str, ...] = ()
    forbidden_why: str = ""


def _allowed_import(module: str, allowed) -> bool:
    return any(module == a or module.startswith(a + ".") for a in allowed)


def review(source: str, policy: Policy) -> str | None:
    """The first reason ``source`` is not an acceptable answer, or None."""
    try:
        tree = ast.parse(source)
    except SyntaxError as err:
        return _("does not compile: {message} (line {line})").format(message=err.msg, line=err.lineno)
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))}
    if policy.name not in defined:
        return _("defines no {name}: keep its definition (def or class {name}) in the answer cell").format(
            name=policy.name)
    dist_names = {"dist"}  # names bound to torch.distributed
    torch_names = {"torch"}
    modules = {"dist", "torch"}  # names bound to modules: assigning to their attributes patches them
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if not _allowed_import(alias.name, policy.imports) or alias.name.split(".")[0] == "parallel_lab":
                    return _import_reason(alias.name, policy)
                bound = alias.asname or alias.name.split(".")[0]
                modules.add(bound)
                if alias.name == TORCH_DIST and alias.asname:
                    dist_names.add(alias.asname)
                if alias.name == "torch" or (alias.name.startswith("torch.") and not alias.asname):
                    torch_names.add(bound)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level or not _allowed_import(module, policy.imports) or module.split(".")[0] == "parallel_lab":
                return _import_reason(module or "." * node.level, policy)
            for alias in node.names:
                if module == "torch" and alias.name == "distributed":
                    dist_names.add(alias.asname or alias.name)
                    modules.add(alias.asname or alias.name)
                elif module == TORCH_DIST and policy.dist is not None and alias.name not in policy.dist:
                    return _dist_reason(alias.name, policy)
                elif alias.name in policy.forbidden:
                    return _forbidden_reason(alias.name, policy)
    for node in ast.walk(tree) if not policy.reflection else ():
        if isinstance(node, ast.Name) and node.id in REFLECTION:
            return _("uses {name}: exercises are written with plain calls (no reflection, no files), so that the "
                     "check can see what the code does").format(name=node.id)
        if isinstance(node, ast.Attribute) and node.attr in policy.forbidden:
            return _forbidden_reason(node.attr, policy)
        if isinstance(node, ast.Attribute):
            if node.attr.startswith("__") and node.attr.endswith("__") and node.attr != "__init__":
                return _("uses {name}: exercises are written without dunder attributes (no reflection)").format(
                    name=node.attr)
            if (policy.dist is not None and _is_dist(node.value, dist_names, torch_names)
                    and node.attr not in policy.dist):
                return _dist_reason(node.attr, policy)
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for target in targets:
                root = _root_name(target)
                if isinstance(target, ast.Attribute) and root in modules:
                    return _("changes {target}: an answer computes with torch; it may not change torch, "
                             "torch.distributed or the library").format(target=ast.unparse(target))
    return None


def _is_dist(node, dist_names, torch_names) -> bool:
    """``dist`` (or an alias), or ``torch.distributed``."""
    if isinstance(node, ast.Name):
        return node.id in dist_names
    return (isinstance(node, ast.Attribute) and node.attr == "distributed" and isinstance(node.value, ast.Name)
            and node.value.id in torch_names)


def _root_name(node) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _import_reason(module: str, policy: Policy) -> str:
    if module.split(".")[0] == "parallel_lab":
        return _("imports {module}: the library's own implementation is not an answer; write {name} "
                 "yourself").format(module=module, name=policy.name)
    allowed = ", ".join(policy.imports) or _("nothing")
    return _("imports {module}: this exercise may import only {allowed}").format(module=module, allowed=allowed)


def _dist_reason(attr: str, policy: Policy) -> str:
    allowed = ", ".join(f"dist.{a}" for a in policy.dist) or _("nothing from torch.distributed")
    why = _("; this exercise builds {what}").format(what=policy.builds) if policy.builds else ""
    return _("uses dist.{name}{why} (allowed: {allowed})").format(name=attr, why=why, allowed=allowed)


def _forbidden_reason(name: str, policy: Policy) -> str:
    why = _(": {why}").format(why=policy.forbidden_why) if policy.forbidden_why else ""
    return _("uses {name}, which does this exercise's work for you{why}").format(name=name, why=why)
