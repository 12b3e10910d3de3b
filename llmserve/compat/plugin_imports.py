"""Static analysis of plugin and processor code: which vLLM names it imports, and whether its
logits processors fit the locked processor interface. Nothing is imported or executed.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from llmserve.compat.surface import ModuleIndex

V1_PROCESSOR_MODULES = ("vllm.v1.sample.logits_processor", "vllm.v1.sample.logits_processor.interface")


@dataclass
class ImportUse:
    file: str
    line: int
    module: str
    symbol: str  # "" for `import module`
    optional: bool  # inside try/except ImportError: the code copes with its absence


@dataclass
class ClassInfo:
    file: str
    line: int
    name: str
    bases: list[str]  # dotted names as written
    methods: dict[str, int]  # method name -> number of positional parameters (self included)


@dataclass
class CodeFacts:
    imports: list[ImportUse] = field(default_factory=list)
    classes: dict[str, ClassInfo] = field(default_factory=dict)  # "file:Class" and "Class"
    aliases: dict[tuple[str, str], str] = field(default_factory=dict)  # (file, local name) -> "module:attr" / "module"
    errors: list[str] = field(default_factory=list)


def _catches_import_error(handlers: list[ast.ExceptHandler]) -> bool:
    for h in handlers:
        names = []
        if h.type is None:
            return True
        for n in h.type.elts if isinstance(h.type, ast.Tuple) else [h.type]:
            names.append(n.id if isinstance(n, ast.Name) else getattr(n, "attr", ""))
        if {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"} & set(names):
            return True
    return False


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    if isinstance(node, ast.Subscript):
        return _dotted(node.value)
    return ""


class _Visitor(ast.NodeVisitor):
    def __init__(self, file: str, facts: CodeFacts):
        self.file, self.facts, self.optional = file, facts, 0

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
            isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
        ):
            for n in node.orelse:
                self.visit(n)
            return
        self.generic_visit(node)

    def visit_Try(self, node: ast.Try) -> None:
        guarded = _catches_import_error(node.handlers)
        self.optional += guarded
        for n in node.body:
            self.visit(n)
        self.optional -= guarded
        for h in node.handlers:
            self.visit(h)
        for n in node.orelse + node.finalbody:
            self.visit(n)

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            if a.name == "vllm" or a.name.startswith("vllm."):
                self.facts.imports.append(ImportUse(self.file, node.lineno, a.name, "", self.optional > 0))
                self.facts.aliases[(self.file, a.asname or a.name)] = a.name

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        mod = node.module or ""
        if node.level == 0 and (mod == "vllm" or mod.startswith("vllm.")):
            for a in node.names:
                if a.name == "*":
                    continue
                self.facts.imports.append(ImportUse(self.file, node.lineno, mod, a.name, self.optional > 0))
                self.facts.aliases[(self.file, a.asname or a.name)] = f"{mod}:{a.name}"

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        methods = {}
        for n in node.body:
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = n.args
                methods[n.name] = len(args.posonlyargs) + len(args.args)
        info = ClassInfo(self.file, node.lineno, node.name, [_dotted(b) for b in node.bases], methods)
        self.facts.classes[f"{self.file}:{node.name}"] = info
        self.facts.classes.setdefault(node.name, info)
        self.generic_visit(node)


def analyze_sources(files: dict[str, str]) -> CodeFacts:
    """files: display path -> Python source."""
    facts = CodeFacts()
    for path in sorted(files):
        try:
            tree = ast.parse(files[path], filename=path)
        except SyntaxError as exc:
            facts.errors.append(f"{path}:{exc.lineno}: does not parse ({exc.msg})")
            continue
        _Visitor(path, facts).visit(tree)
    return facts


def _base_target(facts: CodeFacts, file: str, base: str) -> str:
    """What a base-class expression refers to: "module:attr" for imported names, else the name itself."""
    head, _, rest = base.partition(".")
    alias = facts.aliases.get((file, head))
    if alias is None:
        return base
    if not rest:
        return alias
    mod, _, attr = f"{alias.replace(':', '.')}.{rest}".rpartition(".")
    return f"{mod}:{attr}"


@dataclass
class ProcessorClass:
    info: ClassInfo
    interface: str  # "module:Class" it ultimately subclasses
    methods: dict[str, int]  # own methods plus those of local bases


def processor_classes(facts: CodeFacts) -> list[ProcessorClass]:
    """Concrete classes that (directly or through local classes) subclass a vLLM LogitsProcessor.
    A class that other local classes derive from is an intermediate base and is not judged alone."""
    out = []
    used_as_base = {b.rsplit(".", 1)[-1] for info in facts.classes.values() for b in info.bases}
    for key, info in sorted(facts.classes.items()):
        if ":" not in key or info.name in used_as_base:
            continue
        methods: dict[str, int] = {}
        chain, seen, found = [info], set(), None
        while chain and found is None:
            cls = chain.pop(0)
            if id(cls) in seen:
                continue
            seen.add(id(cls))
            for name, n in cls.methods.items():
                methods.setdefault(name, n)
            for base in cls.bases:
                target = _base_target(facts, cls.file, base)
                if target.endswith(":LogitsProcessor") and target.startswith("vllm"):
                    found = target
                elif local := facts.classes.get(f"{cls.file}:{base}") or facts.classes.get(base.rsplit(".", 1)[-1]):
                    chain.append(local)
        if found:
            out.append(ProcessorClass(info, found, methods))
    return out


def interface_contract(index: ModuleIndex, module: str, base: str) -> tuple[dict[str, int], set[str]] | None:
    """(method -> positional arity, abstract method names) of the interface class, read statically."""
    mod = index.module(module)
    if mod is None:
        return None
    text = index.source.read(mod.relpath) or ""
    tree = ast.parse(text)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == base:
            arity, abstract = {}, set()
            for n in node.body:
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    arity[n.name] = len(n.args.posonlyargs) + len(n.args.args)
                    if any(_dotted(d).endswith("abstractmethod") for d in n.decorator_list):
                        abstract.add(n.name)
            return arity, abstract
    return None
