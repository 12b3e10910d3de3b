// Walkers over the converter's regular-expression trees as Python builds them (nested tuples, the
// node kinds of llmserve/constraints/regex.py: ("set", ranges), ("cat" | "alt", children),
// ("rep" | "list", child, lo, hi-or-None), ("members", [(required, child), ...], flag),
// ("dfa", automaton)). They do what regex.expanded_size and regex.serialize_ast do in Python (the
// reference, which tests compare against) at C speed: a large schema's tree is tens of thousands of
// nodes written out once per use of a shared reference, and the Python walks took about a third of
// a lazy compile to the first mask. Like bindings.cpp, this file knows about Python; the GIL is held
// throughout (every step reads Python objects). The trees are the converter's own: a walk holds
// borrowed pointers into their lists, so a tree must not be changed while it is walked (the
// dfa_words callback does not).

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace llmserve {
namespace {

// the serialised node kinds (csrc/dfa.h's layout; regex.py's _SET ... _LIST)
enum Word : int32_t { kSet = 0, kCat = 1, kAlt = 2, kRep = 3, kDfa = 4, kMembers = 5, kList = 6 };
enum class Kind { Set, Cat, Alt, Rep, Members, List, Dfa };

[[noreturn]] void malformed(const std::string& why) { throw std::invalid_argument("malformed tree node: " + why); }

// a node's fields (borrowed from the node tuple)
PyObject* field(PyObject* node, Py_ssize_t i) {
  if (!PyTuple_Check(node)) malformed("not a tuple");
  if (PyTuple_GET_SIZE(node) <= i) malformed("too few fields");
  return PyTuple_GET_ITEM(node, i);
}

Kind kind_of(PyObject* node) {
  PyObject* k = field(node, 0);
  Py_ssize_t n = 0;
  const char* s = PyUnicode_Check(k) ? PyUnicode_AsUTF8AndSize(k, &n) : nullptr;
  if (s == nullptr) {
    PyErr_Clear();
    malformed("its kind is not a string");
  }
  const std::string_view kind(s, static_cast<size_t>(n));
  if (kind == "cat") return Kind::Cat;
  if (kind == "alt") return Kind::Alt;
  if (kind == "set") return Kind::Set;
  if (kind == "rep") return Kind::Rep;
  if (kind == "members") return Kind::Members;
  if (kind == "list") return Kind::List;
  if (kind == "dfa") return Kind::Dfa;
  malformed("unknown kind " + std::string(kind));
}

// a sequence field (list or tuple) as a borrowed array of items; `hold` keeps it alive
PyObject** items_of(PyObject* seq, Py_ssize_t& n, py::object& hold) {
  hold = py::reinterpret_steal<py::object>(PySequence_Fast(seq, "tree node: expected a list or tuple"));
  if (!hold) throw py::error_already_set();
  n = PySequence_Fast_GET_SIZE(hold.ptr());
  return PySequence_Fast_ITEMS(hold.ptr());
}

// an integer field, saturated to the int64 range (counts past it are refused by size anyway)
int64_t int_of(PyObject* v) {
  int overflow = 0;
  const long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
  if (x == -1 && PyErr_Occurred()) throw py::error_already_set();
  if (overflow != 0) return overflow > 0 ? INT64_MAX : INT64_MIN;
  return x;
}

int64_t add_sat(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_add_overflow(a, b, &r) ? INT64_MAX : r;
}
int64_t sub_sat(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_sub_overflow(a, b, &r) ? (b < 0 ? INT64_MAX : INT64_MIN) : r;
}
int64_t mul_sat(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_mul_overflow(a, b, &r) ? INT64_MAX : r;
}

// expanded_size's memo across calls: sizes found by node, the nodes held so that their addresses
// are not reused while the memo lives (the converter asks about each reference's tree, which holds
// the trees it asked about before). A dict keyed by id() cost more than the walk: object addresses
// share their low bits, and CPython's int hash keeps them.
class TreeSizes {
 public:
  bool find(PyObject* n, int64_t& out) const {
    auto it = sizes_.find(n);
    if (it == sizes_.end()) return false;
    out = it->second;
    return true;
  }
  void put(PyObject* n, int64_t size) {
    if (sizes_.emplace(n, size).second) held_.push_back(py::reinterpret_borrow<py::object>(n));
  }
  size_t size() const { return sizes_.size(); }

 private:
  std::unordered_map<PyObject*, int64_t> sizes_;
  std::vector<py::object> held_;
};

// one node on expanded_size's stack: its kind, its children, the next child to count
struct SizeFrame {
  PyObject* node;
  Kind kind;
  py::object hold;  // the children's sequence
  PyObject** items = nullptr;
  Py_ssize_t count = 0;
  Py_ssize_t next = 0;
};

SizeFrame frame_of(PyObject* n) {
  SizeFrame f{n, kind_of(n), py::object()};
  if (f.kind == Kind::Rep || f.kind == Kind::List) {
    field(n, 3);  // lo and hi are read once the child is counted
    f.items = &PyTuple_GET_ITEM(n, 1);
    f.count = 1;
  } else if (f.kind != Kind::Dfa) {
    f.items = items_of(field(n, 1), f.count, f.hold);
  }
  return f;
}

PyObject* child_at(const SizeFrame& f, Py_ssize_t i) {
  if (f.kind != Kind::Members) return f.items[i];
  PyObject* member = f.items[i];
  if (!PyTuple_Check(member) || PyTuple_GET_SIZE(member) != 2) malformed("a member is not (required, child)");
  return PyTuple_GET_ITEM(member, 1);
}

// regex.expanded_size's count (capped at cap + 1), with a memo across calls (`memo`, may be null)
int64_t expanded_size(py::handle root, int64_t cap, TreeSizes* memo) {
  TreeSizes local;
  TreeSizes& sizes = memo != nullptr ? *memo : local;
  const int64_t capped = add_sat(cap, 1);
  int64_t out = 0;
  if (sizes.find(root.ptr(), out)) return out;
  std::vector<SizeFrame> stack;
  stack.push_back(frame_of(root.ptr()));
  while (!stack.empty()) {
    SizeFrame& f = stack.back();
    if (f.kind != Kind::Set && f.next < f.count) {
      PyObject* c = child_at(f, f.next++);
      int64_t known = 0;
      if (!sizes.find(c, known)) stack.push_back(frame_of(c));  // may move f: not used below
      continue;
    }
    auto size_of = [&](PyObject* c) {
      int64_t s = 0;
      if (!sizes.find(c, s)) malformed("a child was not counted");
      return s;
    };
    int64_t size = 0;
    switch (f.kind) {
      case Kind::Set:
        size = add_sat(2, mul_sat(3, f.count));
        break;
      case Kind::Dfa: {
        py::object states = py::reinterpret_borrow<py::object>(field(f.node, 1)).attr("num_states");
        size = add_sat(1, int_of(states.ptr()));
        break;
      }
      case Kind::Cat:
      case Kind::Alt:
      case Kind::Members:
        size = 2;
        for (Py_ssize_t i = 0; i < f.count; ++i) {
          const int64_t s = size_of(child_at(f, i));
          size = add_sat(size, f.kind == Kind::Members ? add_sat(5, s) : s);
        }
        break;
      case Kind::List:
      case Kind::Rep: {
        const int64_t child = size_of(f.items[0]), lo = int_of(field(f.node, 2));
        PyObject* hi_obj = field(f.node, 3);
        const bool unbounded = hi_obj == Py_None;
        const int64_t hi = unbounded ? 0 : int_of(hi_obj);
        if (f.kind == Kind::List) {
          size = add_sat(2, mul_sat(add_sat(child, 1), unbounded ? std::max<int64_t>(lo, 1) : hi));
        } else {
          size = add_sat(3, mul_sat(child, add_sat(lo, unbounded ? 1 : sub_sat(hi, lo))));
        }
        break;
      }
    }
    sizes.put(f.node, std::min(size, capped));
    stack.pop_back();
  }
  sizes.find(root.ptr(), out);
  return out;
}

int32_t word_of(int64_t v) {
  if (v < INT32_MIN || v > INT32_MAX) throw std::overflow_error("tree node: a count does not fit the int32 words");
  return static_cast<int32_t>(v);
}

// regex.serialize_ast's prefix words; an embedded automaton's words come from `dfa_words(automaton)`
py::array_t<int32_t> tree_words(py::handle root, const py::function& dfa_words) {
  std::vector<int32_t> out;
  // nodes to write, or a member's required flag (pushed just before its child): (node, -1) or
  // (nullptr, flag)
  std::vector<std::pair<PyObject*, int>> stack{{root.ptr(), -1}};
  std::vector<py::object> holds;  // sequences taken from nodes, alive until the walk ends
  while (!stack.empty()) {
    const auto [n, flag] = stack.back();
    stack.pop_back();
    if (n == nullptr) {
      out.push_back(flag);
      continue;
    }
    const Kind k = kind_of(n);
    switch (k) {
      case Kind::Set: {
        py::object hold;
        Py_ssize_t count = 0;
        PyObject** ranges = items_of(field(n, 1), count, hold);
        out.push_back(kSet);
        out.push_back(word_of(count));
        for (Py_ssize_t i = 0; i < count; ++i) {
          PyObject* r = ranges[i];
          if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) != 2) malformed("a range is not (lo, hi)");
          out.push_back(word_of(int_of(PyTuple_GET_ITEM(r, 0))));
          out.push_back(word_of(int_of(PyTuple_GET_ITEM(r, 1))));
        }
        break;
      }
      case Kind::Cat:
      case Kind::Alt: {
        holds.emplace_back();
        Py_ssize_t count = 0;
        PyObject** items = items_of(field(n, 1), count, holds.back());
        out.push_back(k == Kind::Cat ? kCat : kAlt);
        out.push_back(word_of(count));
        for (Py_ssize_t i = count; i-- > 0;) stack.emplace_back(items[i], -1);
        break;
      }
      case Kind::Rep:
      case Kind::List: {
        PyObject* hi = field(n, 3);
        out.push_back(k == Kind::Rep ? kRep : kList);
        out.push_back(word_of(int_of(field(n, 2))));
        out.push_back(hi == Py_None ? -1 : word_of(int_of(hi)));
        stack.emplace_back(field(n, 1), -1);
        break;
      }
      case Kind::Members: {
        holds.emplace_back();
        Py_ssize_t count = 0;
        PyObject** members = items_of(field(n, 1), count, holds.back());
        const int at_least_one = PyObject_IsTrue(field(n, 2));
        if (at_least_one < 0) throw py::error_already_set();
        out.push_back(kMembers);
        out.push_back(word_of(count));
        out.push_back(at_least_one);
        for (Py_ssize_t i = count; i-- > 0;) {
          PyObject* m = members[i];
          if (!PyTuple_Check(m) || PyTuple_GET_SIZE(m) != 2) malformed("a member is not (required, child)");
          const int required = PyObject_IsTrue(PyTuple_GET_ITEM(m, 0));
          if (required < 0) throw py::error_already_set();
          stack.emplace_back(PyTuple_GET_ITEM(m, 1), -1);
          stack.emplace_back(nullptr, required ? 1 : 0);
        }
        break;
      }
      case Kind::Dfa: {
        py::array_t<int32_t, py::array::c_style | py::array::forcecast> words =
            dfa_words(py::reinterpret_borrow<py::object>(field(n, 1)));
        if (words.ndim() != 1) malformed("an automaton's words are not one-dimensional");
        out.insert(out.end(), words.data(), words.data() + words.shape(0));
        break;
      }
    }
  }
  py::array_t<int32_t> result(static_cast<py::ssize_t>(out.size()));
  if (!out.empty()) std::memcpy(result.mutable_data(), out.data(), out.size() * sizeof(int32_t));
  return result;
}

}  // namespace

void bind_tree_walkers(py::module_& m) {
  py::class_<TreeSizes>(m, "TreeSizes", "tree_expanded_size's memo across calls (holds the nodes it counted).")
      .def(py::init<>())
      .def("__len__", &TreeSizes::size);
  m.def("tree_expanded_size", &expanded_size, py::arg("node"), py::arg("cap"), py::arg("sizes") = nullptr,
        "regex.expanded_size of a converter tree (same counts), with a memo across calls.");
  m.def("tree_words", &tree_words, py::arg("node"), py::arg("dfa_words"),
        "regex.serialize_ast of a converter tree; an embedded automaton's words from dfa_words(automaton).");
}

}  // namespace llmserve
