"""Print, as JSON, the wire shapes the Python client declares, for
internal/api's TestOneSchema to hold against api/openapi.yaml.

types: every public TypedDict in smx.types: its fields, whether each is
required, and its type as "string", "integer", "boolean", "number",
"object", "any", "array<T>" or "ref:Name".

bodies: every _body(Kind, key=value, ...) call in the client modules
(how a method builds a request): the kind, the keywords, and for a keyword
whose value is a parameter of the method, that parameter's default.

sync, async: each public method of smx.Client and smx.AsyncClient with its
parameters (name, kind, default)."""

import ast
import inspect
import json
import sys
import typing

import smx
import smx.types as T


def kind(tp):
    origin = typing.get_origin(tp)
    if tp is str:
        return "string"
    if tp is bool:
        return "boolean"
    if tp is int:
        return "integer"
    if tp is float:
        return "number"
    if tp is typing.Any:
        return "any"
    if origin in (list, typing.List):
        (item,) = typing.get_args(tp)
        return "array<" + kind(item) + ">"
    if origin in (dict, typing.Dict):
        return "object"
    if isinstance(tp, type) and issubclass(tp, dict) and hasattr(tp, "__required_keys__"):
        return "ref:" + tp.__name__
    if origin is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return kind(args[0])
    return "unknown:" + repr(tp)


types = {}
for name in dir(T):
    v = getattr(T, name)
    if name.startswith("_") or not (isinstance(v, type) and issubclass(v, dict) and hasattr(v, "__required_keys__")):
        continue
    hints = typing.get_type_hints(v)
    types[name] = {f: {"required": f in v.__required_keys__, "type": kind(hints[f])} for f in hints}


def literal(node):
    try:
        return ast.literal_eval(node)
    except ValueError:
        return "<expr>"


bodies = []
for path in sys.argv[1:]:
    tree = ast.parse(open(path).read(), path)
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        a = fn.args
        defaults = {}
        pos = a.posonlyargs + a.args
        for arg, d in zip(pos[len(pos) - len(a.defaults):], a.defaults):
            defaults[arg.arg] = literal(d)
        for arg, d in zip(a.kwonlyargs, a.kw_defaults):
            if d is not None:
                defaults[arg.arg] = literal(d)
        for call in ast.walk(fn):
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "_body"):
                continue
            keys = {}
            kws = []
            for kw in call.keywords:
                if kw.arg is None and isinstance(kw.value, ast.Dict):  # **{"from": ...}: a key that is a keyword
                    kws += [(k.value, v) for k, v in zip(kw.value.keys, kw.value.values) if isinstance(k, ast.Constant)]
                else:
                    kws.append((kw.arg, kw.value))
            for arg, v in kws:
                if isinstance(v, ast.BoolOp) and v.values:  # flag or None
                    v = v.values[0]
                if isinstance(v, ast.Name) and v.id in defaults:
                    keys[arg] = {"param": v.id, "default": defaults[v.id], "has_default": True}
                else:
                    keys[arg] = {"has_default": False}
            bodies.append({"file": path, "line": call.lineno, "func": fn.name,
                           "kind": call.args[0].id if call.args and isinstance(call.args[0], ast.Name) else "",
                           "keys": keys})


def signatures(cls):
    out = {}
    for name, fn in vars(cls).items():
        if name.startswith("_") or not callable(fn):
            continue
        sig = inspect.signature(fn)
        out[name] = [[p.name, str(p.kind), repr(p.default)] for p in sig.parameters.values()]
    return out


json.dump({"types": types, "bodies": bodies,
           "sync": signatures(smx.Client), "async": signatures(smx.AsyncClient)}, sys.stdout)
