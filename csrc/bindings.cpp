// Python binding of the constraint core (module llmserve.constraints._core, typed in
// llmserve/constraints/_core.pyi); with tree_bindings.cpp (walkers over Python trees) the only files
// that know about Python. The pure-Python reference with the same interface is
// llmserve/constraints/reference.py (property tests check they agree exactly).
// Every call that touches [B, V]-sized memory releases the GIL; Python lists (the engine's running
// output-token lists) are only read in sync(), with the GIL held.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>

#include "apply.h"
#include "batch.h"
#include "checksum.h"
#include "comb.h"
#include "dfa.h"
#include "finisher.h"
#include "grammar.h"
#include "lazy_dfa.h"
#include "thread_pool.h"
#include "tree_facts.h"
#include "vocab_trie.h"

namespace py = pybind11;
using namespace llmserve;

namespace {

template <typename T>
T* buffer_of(py::array& a, int ndim, const char* what, bool writable) {
  if (!py::isinstance<py::array_t<T>>(a) || a.dtype().kind() != py::dtype::of<T>().kind() ||
      a.itemsize() != sizeof(T))
    throw std::invalid_argument(std::string(what) + ": wrong dtype");
  if (a.ndim() != ndim) throw std::invalid_argument(std::string(what) + ": wrong number of dimensions");
  if (reinterpret_cast<uintptr_t>(a.data()) % alignof(T) != 0)
    throw std::invalid_argument(std::string(what) + ": misaligned");
  if (a.size() > 0 && a.strides(ndim - 1) != static_cast<py::ssize_t>(sizeof(T)))
    throw std::invalid_argument(std::string(what) + ": last dimension must be contiguous");
  if (writable && !a.writeable()) throw std::invalid_argument(std::string(what) + ": read-only");
  return static_cast<T*>(writable ? a.mutable_data() : const_cast<void*>(a.data()));
}

// A vector handed to numpy as it is, not copied (numpy owns it through a capsule): a large form's
// arrays would otherwise be held twice while they are handed over. Read-only: the core checked every
// index in them once, and reads them unchecked after (a base written later could point anywhere).
template <typename T>
py::array owned_array(std::vector<T>&& v, std::vector<py::ssize_t> shape) {
  auto* owned = new std::vector<T>(std::move(v));
  py::capsule owner(owned, [](void* p) { delete static_cast<std::vector<T>*>(p); });
  py::array a = py::array_t<T>(std::move(shape), owned->data(), owner);
  a.attr("setflags")(py::arg("write") = false);
  return a;
}

// Rows a batch may hold: far above any engine's batch, low enough that a wrong index fails here
// rather than as an allocation of terabytes.
constexpr int64_t kMaxRows = int64_t(1) << 24;

void check_row(int64_t i, const char* what) {
  if (i < 0 || i >= kMaxRows)
    throw std::invalid_argument(std::string(what) + ": row index " + std::to_string(i) + " out of range");
}

// A DFA's table: int32[S, 256] with C-contiguous rows and every entry a state or -1.
const int32_t* dfa_table(py::array& table, py::array& accept, int64_t& S) {
  const int32_t* t = buffer_of<int32_t>(table, 2, "table", false);
  buffer_of<uint8_t>(accept, 1, "accept", false);
  S = table.shape(0);
  if (table.shape(1) != 256 || accept.shape(0) != S) throw std::invalid_argument("table/accept shapes");
  if (S > 1 && table.strides(0) != 256 * static_cast<py::ssize_t>(sizeof(int32_t)))
    throw std::invalid_argument("table must be C-contiguous");
  for (int64_t i = 0; i < S * 256; ++i)
    if (t[i] < -1 || t[i] >= S) throw std::invalid_argument("table entry out of range");
  return t;
}

// A 2-D array of states, int16 (where the automaton's states fit) or int32: as Transitions reads it.
struct States {
  const int32_t* t = nullptr;
  const int16_t* t16 = nullptr;
  bool narrow() const { return t16 != nullptr; }
};

States states_of(py::array& a, const char* what) {
  if (a.itemsize() == sizeof(int16_t)) return {nullptr, buffer_of<int16_t>(a, 2, what, false)};
  return {buffer_of<int32_t>(a, 2, what, false), nullptr};
}

// Every one of the first n entries a state below S, or -1.
void check_states(const States& st, int64_t n, int64_t S, const char* what) {
  for (int64_t i = 0; i < n; ++i) {
    const int32_t x = st.narrow() ? st.t16[i] : st.t[i];
    if (x < -1 || x >= S) throw std::invalid_argument(std::string(what) + " out of range");
  }
}

// A DFA's transitions over byte classes: classes uint8[256] and table int32[S, C] (or int16 where S
// fits) with C-contiguous rows, every class below C and every entry a state or -1. Checked whole:
// the arrays may come from a cache file.
Transitions class_table(py::array& classes, py::array& table, py::array& accept, int64_t& S) {
  const uint8_t* cls = buffer_of<uint8_t>(classes, 1, "classes", false);
  const States st = states_of(table, "table");
  buffer_of<uint8_t>(accept, 1, "accept", false);
  S = table.shape(0);
  const int64_t C = table.shape(1);
  if (classes.shape(0) != 256 || accept.shape(0) != S || C < 1 || C > 256 ||
      (S > 1 && table.strides(0) != C * static_cast<py::ssize_t>(table.itemsize())))
    throw std::invalid_argument("classes/table/accept shapes");
  for (int b = 0; b < 256; ++b)
    if (cls[b] >= C) throw std::invalid_argument("byte class out of range");
  check_states(st, S * C, S, "table entry");
  Transitions tr{st.t, cls, C};
  tr.t16 = st.t16;
  return tr;
}

// The very array in a Python object, not a converted copy: pointers into it stay valid while the
// caller keeps the object alive (a converted copy would be a temporary).
py::array array_in(const py::handle& o, const char* what) {
  if (!py::isinstance<py::array>(o)) throw py::type_error(std::string(what) + " must be a numpy array");
  return py::reinterpret_borrow<py::array>(o);
}

// A comb's transitions (comb.h) over byte classes: classes uint8[256], (base int32[S], slots [N, 2]
// int16 where S fits, else int32) with C-contiguous rows; every base[s] + C within the slots (C: the
// largest class + 1) and every owner and next a state or -1. Checked whole, as class_table.
Transitions comb_table(py::array& classes, const py::tuple& comb, py::array& accept, int64_t& S) {
  if (comb.size() != 2) throw std::invalid_argument("comb: (base, slots)");
  py::array base_a = array_in(comb[0], "comb base");
  py::array slots = array_in(comb[1], "comb slots");
  const uint8_t* cls = buffer_of<uint8_t>(classes, 1, "classes", false);
  const int32_t* base = buffer_of<int32_t>(base_a, 1, "comb base", false);
  const States st = states_of(slots, "comb slots");
  buffer_of<uint8_t>(accept, 1, "accept", false);
  S = base_a.shape(0);
  const int64_t N = slots.shape(0);
  if (classes.shape(0) != 256 || accept.shape(0) != S || slots.shape(1) != 2 ||
      (N > 1 && slots.strides(0) != 2 * static_cast<py::ssize_t>(slots.itemsize())) ||
      (st.narrow() && S > Transitions::kMax16))
    throw std::invalid_argument("classes/comb/accept shapes");
  const int64_t C = *std::max_element(cls, cls + 256) + 1;
  for (int64_t s = 0; s < S; ++s)
    if (base[s] < 0 || base[s] + C > N) throw std::invalid_argument("comb base out of range");
  check_states(st, 2 * N, S, "comb slot");
  Transitions tr{st.t, cls, C};
  tr.t16 = st.t16;
  tr.base = base;
  return tr;
}

// A compressed form's transitions for numpy: (base int32[S], slots [N, 2]), the slots in int16 where
// every state fits (half the memory). Handed over without a copy where the width allows.
py::tuple comb_arrays(Comb&& comb) {
  const int64_t S = static_cast<int64_t>(comb.base.size());
  const auto N = static_cast<py::ssize_t>(comb.slots.size() / 2);
  py::array base = owned_array(std::move(comb.base), {static_cast<py::ssize_t>(S)});
  if (S <= Transitions::kMax16) {
    std::vector<int16_t> narrow(comb.slots.begin(), comb.slots.end());
    comb.slots = {};
    return py::make_tuple(base, owned_array(std::move(narrow), {N, 2}));
  }
  return py::make_tuple(base, owned_array(std::move(comb.slots), {N, 2}));
}

// The transitions of a table given with or without its byte classes (None: a dense [S, 256] table;
// with classes, a table of their columns or a comb, (base, slots)).
Transitions any_table(const py::object& classes, const py::object& table, py::array& accept, int64_t& S) {
  if (classes.is_none()) {
    if (py::isinstance<py::tuple>(table)) throw std::invalid_argument("a comb needs its byte classes");
    py::array t = array_in(table, "table");
    return Transitions::dense(dfa_table(t, accept, S));
  }
  py::array c = array_in(classes, "classes");
  if (py::isinstance<py::tuple>(table)) return comb_table(c, table.cast<py::tuple>(), accept, S);
  py::array t = array_in(table, "table");
  return class_table(c, t, accept, S);
}

// A Python object that must be of a core class (pybind's own cast failure is a RuntimeError).
template <typename T>
T& cast_to(const py::object& o, const char* what) {
  if (!py::isinstance<T>(o)) throw py::type_error(std::string(what) + " has the wrong type");
  return o.cast<T&>();
}

struct PyVocab {
  std::shared_ptr<Vocab> v;
};

// A LazyDfa shared by Python threads and the grammars over it: every use holds the lock (without the
// GIL).
struct PyLazyDfa {
  std::shared_ptr<LazyDfa> d;
  std::shared_ptr<std::mutex> lock = std::make_shared<std::mutex>();
  int32_t checked(int64_t s) const {
    if (s < 0 || s >= d->found()) throw std::invalid_argument("state out of range");
    return static_cast<int32_t>(s);
  }
};

// Lower dist[S] in place to the fewest tokens to an accepting state (see the bindings' docstrings).
// Reads the automaton and the vocabulary's trie only, never a mask row: a frontend's budget check
// runs it without compiling the constraint's mask tables.
int64_t lower_token_distances(const Vocab& v, const Transitions& tr, const uint8_t* accept, int64_t S, int32_t* d,
                              const int32_t* ord) {
  std::vector<int32_t> stack(v.max_len() + 2);
  int64_t rounds = 0;
  for (bool changed = true; changed; ++rounds) {
    changed = false;
    for (int64_t i = 0; i < S; ++i) {
      const int32_t s = ord[i];
      if (accept[s]) continue;
      const int32_t m = v.min_successor(tr, s, d, stack.data());
      if (m != INT32_MAX && m + 1 < d[s]) {
        d[s] = m + 1;
        changed = true;
      }
    }
  }
  return rounds;
}

void check_order(const int32_t* ord, int64_t S) {
  for (int64_t i = 0; i < S; ++i)
    if (ord[i] < 0 || ord[i] >= S) throw std::invalid_argument("token_distances: order holds a state out of range");
}

struct PyGrammar {
  std::shared_ptr<Grammar> g;
  py::object table, accept, masks;  // keep the buffers alive (table: a comb, (base, slots), once compressed)
  py::object classes;               // a compressed grammar's byte classes
  py::tuple rows;                   // compressed rows (row_of, off, kind, data), kept alive likewise
  py::tuple shared;                 // the shared rows they name, ((kind, words), ...), likewise
};

// A compressed grammar over arrays from Python (possibly from a cache file): every index checked.
PyGrammar compressed_grammar(const PyVocab& v, py::array classes, py::object table, py::array accept,
                             py::array row_of, py::array off, py::array kind, py::array data, int32_t start,
                             const py::tuple& shared) {
  PyGrammar g;
  g.g = std::make_shared<Grammar>();
  Grammar& gr = *g.g;
  gr.vocab = v.v;
  int64_t S = 0;
  gr.tr = any_table(classes, table, accept, S);
  gr.accept = static_cast<const uint8_t*>(accept.data());
  gr.S = S;
  gr.start = start;
  if (start < 0 || start >= S) throw std::invalid_argument("start state out of range");
  CompactRows& c = gr.rows;
  c.row_of = buffer_of<int32_t>(row_of, 1, "row_of", false);
  c.off = buffer_of<int64_t>(off, 1, "off", false);
  c.kind = buffer_of<uint8_t>(kind, 1, "kind", false);
  c.data = buffer_of<uint32_t>(data, 1, "data", false);
  c.R = kind.shape(0);
  c.W = v.v->words();
  for (const py::handle& item : shared) {
    if (!py::isinstance<py::tuple>(item) || py::len(item) != 2)
      throw std::invalid_argument("shared rows: (kind, words) pairs");
    const py::tuple pair = py::reinterpret_borrow<py::tuple>(item);
    py::array words = array_in(pair[1], "shared row");
    if (!py::isinstance<py::int_>(pair[0])) throw std::invalid_argument("compressed mask rows: a shared row's kind");
    const auto how = pair[0].cast<int64_t>();
    if (how < 0 || how > 255) throw std::invalid_argument("compressed mask rows: a shared row's kind");
    gr.shared_rows.push_back({buffer_of<uint32_t>(words, 1, "shared row", false), words.shape(0),
                              static_cast<uint8_t>(how)});
  }
  c.shared = gr.shared_rows.data();
  c.n_shared = static_cast<int64_t>(gr.shared_rows.size());
  if (row_of.shape(0) != S + 1 || off.shape(0) != c.R + 1) throw std::invalid_argument("compressed rows: shapes");
  {
    const int64_t ndata = data.shape(0);
    py::gil_scoped_release nogil;  // a pass over every row (hundreds of MB at most): not on the GIL
    c.check(S + 1, ndata);
  }
  gr.compact = true;
  gr.init(true);
  g.table = table;
  g.classes = classes;
  g.accept = accept;
  g.rows = py::make_tuple(row_of, off, kind, data);
  g.shared = shared;
  return g;
}

// The compressed rows for numpy, not copied (owned_array).
py::tuple compact_to_numpy(CompactArrays&& a) {
  auto vec = [](auto& v) {
    const auto n = static_cast<py::ssize_t>(v.size());
    return owned_array(std::move(v), {n});
  };
  return py::make_tuple(vec(a.row_of), vec(a.off), vec(a.kind), vec(a.data));
}

// `g` compressed, from the arrays the core made of it (compress, compact_all, the finisher): the same
// vocabulary, acceptance and start; the arrays checked on the way in, as any compressed grammar's.
PyGrammar compressed_from(const PyGrammar& g, CompactArrays&& a, const uint8_t* classes, Comb&& comb) {
  const Grammar& gr = *g.g;
  py::array_t<uint8_t> cls(256);
  std::memcpy(cls.mutable_data(), classes, 256);
  py::tuple table = comb_arrays(std::move(comb));
  py::tuple t = compact_to_numpy(std::move(a));
  return compressed_grammar(PyVocab{gr.vocab}, cls, table, g.accept.cast<py::array>(), t[0].cast<py::array>(),
                            t[1].cast<py::array>(), t[2].cast<py::array>(), t[3].cast<py::array>(), gr.start,
                            py::tuple());
}

// A state id from Python: one of the grammar's states, or -1 (dead; stepping it stays dead).
void check_state(const Grammar& g, int64_t state) {
  if (state < -1 || state >= g.states())
    throw std::invalid_argument("state " + std::to_string(state) + " out of range");
}

// A built automaton's byte table (none with `classes`: its rows over letters are handed over), charged
// to the budget either way: it is what the construction leaves behind, or may be expanded to later.
// The table is allocated here and handed to numpy, not allocated by numpy: numpy asks for transparent
// huge pages on large arrays (madvise), and on a machine whose memory is fragmented the kernel then
// compacts and zeroes 2 MiB pages on first touch, which cost seconds for a 300 MB table where
// ordinary pages cost a tenth of a second.
std::unique_ptr<int32_t[]> byte_table(const Dfa& d, bool classes, Budget& budget) {
  budget.charge(d.states() * 256 * static_cast<int64_t>(sizeof(int32_t)));
  if (classes) return nullptr;
  std::unique_ptr<int32_t[]> bytes(new int32_t[static_cast<size_t>(d.states()) * 256]);
  d.expand(bytes.get());  // rows over letters -> rows over bytes
  return bytes;
}

// build_dfa's result: (table int32[S, 256], accept) or, with `classes`, (letter_of, table int32[S, C],
// accept), the construction's own rows handed over as they are (no copy, no fresh pages to fault in).
py::tuple dfa_arrays(Dfa& d, std::unique_ptr<int32_t[]> bytes, bool classes) {
  const auto S = static_cast<py::ssize_t>(d.states());
  py::array_t<uint8_t> accept(S);
  std::memcpy(accept.mutable_data(), d.accept.data(), d.accept.size());
  if (!classes) {
    py::capsule owner(bytes.get(), [](void* p) { delete[] static_cast<int32_t*>(p); });
    py::array_t<int32_t> table({S, static_cast<py::ssize_t>(256)}, bytes.release(), owner);
    return py::make_tuple(table, accept);
  }
  auto* rows = new std::vector<int32_t>(std::move(d.table));
  py::capsule owner(rows, [](void* p) { delete static_cast<std::vector<int32_t>*>(p); });
  py::array_t<int32_t> table({S, static_cast<py::ssize_t>(d.letters)}, rows->data(), owner);
  py::array_t<uint8_t> letter_of(256);
  std::memcpy(letter_of.mutable_data(), d.letter_of, 256);
  return py::make_tuple(letter_of, table, accept);
}

// An automaton construction's limits (build_dfa, LazyDfa): state ids are int32.
void check_state_limits(int64_t max_states, int64_t max_nfa_states) {
  constexpr int64_t kIds = int64_t(1) << 31;
  if (max_states <= 0 || max_nfa_states <= 0 || max_states >= kIds || max_nfa_states >= kIds)
    throw std::invalid_argument("max_states and max_nfa_states must be in [1, 2^31)");
}

// The calls that read a whole automaton or every row refuse a grammar over a lazy one.
void check_whole(const Grammar& g, const char* what) {
  if (g.lazy) throw std::invalid_argument(std::string(what) + ": not for a grammar over a lazy automaton");
}

struct RowPy {
  py::object grammar;  // PyGrammar or None
  py::object tokens;   // the engine's output-token list (a reference, it grows in place)
  int64_t consumed = 0;
  int64_t last = -1;
};

class PyBatch {
 public:
  explicit PyBatch(const PyVocab& v) : core_(v.v) {}

  void ensure(int64_t n) {
    core_.ensure(n);
    if (static_cast<int64_t>(py_.size()) < n) py_.resize(n);
  }

  void set_row(int64_t i, py::object grammar, py::object tokens) {
    check_row(i, "set_row");
    if (!tokens.is_none() && !PyList_Check(tokens.ptr())) throw py::type_error("tokens must be a list");
    if (!grammar.is_none()) {
      auto& pg = cast_to<PyGrammar>(grammar, "grammar");
      if (pg.g->vocab.get() != core_.vocab().get() && pg.g->vocab->words() != core_.vocab()->words())
        throw std::invalid_argument("grammar compiled for another vocabulary");
    }
    ensure(i + 1);
    auto& r = core_.rows()[i];
    auto& p = py_[i];
    p = RowPy{};
    r = RowCore{};
    if (!grammar.is_none()) {
      auto& pg = grammar.cast<PyGrammar&>();
      r.grammar = pg.g;
      r.state = pg.g->start;
      p.grammar = grammar;
    }
    p.tokens = tokens;
  }

  void clear_row(int64_t i) {
    check_row(i, "clear_row");
    if (i < static_cast<int64_t>(py_.size())) {
      py_[i] = RowPy{};
      core_.rows()[i] = RowCore{};
    }
  }

  void move(int64_t src, int64_t dst) {
    check_row(src, "move");
    check_row(dst, "move");
    ensure(std::max(src, dst) + 1);
    if (src == dst) return;
    py_[dst] = std::move(py_[src]);
    core_.rows()[dst] = std::move(core_.rows()[src]);
    py_[src] = RowPy{};
    core_.rows()[src] = RowCore{};
  }

  void swap(int64_t a, int64_t b) {
    check_row(a, "swap");
    check_row(b, "swap");
    ensure(std::max(a, b) + 1);
    std::swap(py_[a], py_[b]);
    std::swap(core_.rows()[a], core_.rows()[b]);
  }

  // Bring every row's state in line with its token list. Returns how many rows were rebuilt from
  // scratch (shorter or diverging history: preemption, a reused slot).
  int64_t sync(int64_t n) {
    int64_t rebuilt = 0;
    n = std::min<int64_t>(n, py_.size());
    for (int64_t i = 0; i < n; ++i) {
      auto& r = core_.rows()[i];
      if (!r.grammar) continue;
      auto& p = py_[i];
      PyObject* lst = p.tokens.ptr();
      if (lst == Py_None || lst == nullptr) continue;
      const int64_t len = PyList_GET_SIZE(lst);
      if (len == p.consumed && (len == 0 || PyLong_AsLongLong(PyList_GET_ITEM(lst, len - 1)) == p.last)) continue;
      if (len < p.consumed ||
          (p.consumed > 0 && PyLong_AsLongLong(PyList_GET_ITEM(lst, p.consumed - 1)) != p.last)) {
        r.state = r.grammar->start;
        p.consumed = 0;
        ++rebuilt;
      }
      int32_t s = r.state;
      for (int64_t k = p.consumed; k < len; ++k) s = r.grammar->step(s, PyLong_AsLongLong(PyList_GET_ITEM(lst, k)));
      if (PyErr_Occurred()) throw py::error_already_set();
      r.state = s;
      p.consumed = len;
      p.last = len ? PyLong_AsLongLong(PyList_GET_ITEM(lst, len - 1)) : -1;
    }
    return rebuilt;
  }

  void fill(py::array out, py::object active, int64_t n, int nthreads) {
    uint32_t* o = buffer_of<uint32_t>(out, 2, "bitmask", true);
    if (out.strides(0) != out.shape(1) * 4) throw std::invalid_argument("bitmask must be C-contiguous");
    if (out.shape(0) > kMaxRows) throw std::invalid_argument("bitmask: too many rows");
    const int64_t B = n < 0 ? out.shape(0) : std::min<int64_t>(n, out.shape(0));
    uint8_t* act = nullptr;
    py::array act_arr;
    if (!active.is_none()) {
      act_arr = active.cast<py::array>();
      act = buffer_of<uint8_t>(act_arr, 1, "active", true);
      if (act_arr.shape(0) < B) throw std::invalid_argument("active too short");
    }
    ensure(B);
    py::gil_scoped_release nogil;
    core_.fill(o, B, out.shape(1), act, nthreads);
  }

  void fill_apply(py::array logits, py::object out, int nthreads) {
    float* l = buffer_of<float>(logits, 2, "logits", true);
    const int64_t B = logits.shape(0), V = logits.shape(1), stride = logits.strides(0) / 4;
    if (B > kMaxRows) throw std::invalid_argument("logits: too many rows");
    if (B > 1 && (logits.strides(0) % 4 != 0 || stride < V)) throw std::invalid_argument("logits: rows overlap");
    uint32_t* o = nullptr;
    int64_t W = (V + 31) / 32;
    py::array out_arr;
    if (!out.is_none()) {
      out_arr = out.cast<py::array>();
      o = buffer_of<uint32_t>(out_arr, 2, "bitmask", true);
      if (out_arr.shape(0) < B || out_arr.shape(1) * 32 < V) throw std::invalid_argument("bitmask too small");
      if (B > 1 && out_arr.strides(0) != out_arr.shape(1) * 4) throw std::invalid_argument("bitmask must be C-contiguous");
      W = out_arr.shape(1);
    }
    ensure(B);
    py::gil_scoped_release nogil;
    core_.fill_apply(l, B, V, stride, o, W, nthreads);
  }

  py::tuple row(int64_t i) const {
    check_row(i, "row");
    if (i >= static_cast<int64_t>(py_.size()) || !core_.rows()[i].grammar) return py::make_tuple(py::none(), 0);
    return py::make_tuple(core_.rows()[i].state, py_[i].consumed);
  }

  int64_t size() const { return py_.size(); }

 private:
  BatchState core_;
  std::vector<RowPy> py_;
};

}  // namespace

namespace llmserve {
void bind_tree_walkers(py::module_& m);  // tree_bindings.cpp
}

PYBIND11_MODULE(_core, m) {
  bind_tree_walkers(m);
  m.doc() = "llmserve constraint core (C++; native thread pool, GIL released on the hot path)";
  m.def("default_threads", &default_threads);
  m.def("pool_size", [] { return ThreadPool::global().size(); });
  m.def("pool_dispatches", [] { return ThreadPool::global().dispatches(); });
  m.def("pool_wakeups", [] { return ThreadPool::global().wakeups(); },
        "Pooled calls that had to wake a sleeping worker (a system call), since the pool started.");
  m.def("pool_spin_joins", [] { return ThreadPool::global().spin_joins(); },
        "Jobs a worker joined while spinning after an earlier one (no wake-up), since the pool started.");
  m.def("pool_spin_backoffs", [] { return ThreadPool::global().spin_backoffs(); },
        "Times the pool saw one of its threads lose its CPU and stopped spinning for spin_backoff_us.");
  m.def("pool_spinning", [] { return ThreadPool::global().spinning(); }, "Workers spinning now.");
  m.def("pool_sleeping", [] { return ThreadPool::global().sleeping(); }, "Workers asleep now.");
  m.def("spin_backoff_us", &spin_backoff_us);
  m.def("set_spin_backoff_us", &set_spin_backoff_us, py::arg("us"),
        "How long the pool stops spinning once it sees one of its threads lose its CPU (0: never "
        "stop; < 0: the default). Returns the previous value.");
  m.def("spin_us", &spin_us);
  m.def("set_spin_us", &set_spin_us, py::arg("us"),
        "How long a worker spins for the next job before it sleeps (0: never spin; < 0: the default). "
        "Returns the previous value.");
  m.def("min_bytes_per_thread", &min_bytes_per_thread);
  m.def("set_min_bytes_per_thread", &set_min_bytes_per_thread, py::arg("bytes"));

  py::class_<PyVocab>(m, "Vocab")
      .def(py::init([](py::array offsets, py::array data, std::vector<int32_t> eos, int64_t size) {
             const int64_t* o = buffer_of<int64_t>(offsets, 1, "offsets", false);
             const uint8_t* d = buffer_of<uint8_t>(data, 1, "data", false);
             if (size < 0 || size >= (int64_t(1) << 31)) throw std::invalid_argument("size out of range");
             if (offsets.shape(0) != size + 1) throw std::invalid_argument("offsets must have size+1 entries");
             for (int32_t e : eos)
               if (e < 0 || e >= size) throw std::invalid_argument("eos id out of range");
             std::vector<int64_t> ov(o, o + size + 1);
             // token i is data[offsets[i]:offsets[i+1]]: offsets must start in the data and never decrease
             if (ov[0] < 0) throw std::invalid_argument("offsets must start at 0 or more");
             for (int64_t i = 0; i < size; ++i)
               if (ov[i + 1] < ov[i]) throw std::invalid_argument("offsets must not decrease");
             if (ov.back() > data.shape(0)) throw std::invalid_argument("offsets past the data");
             std::vector<uint8_t> dv(d, d + data.shape(0));
             PyVocab v;
             {
               py::gil_scoped_release nogil;
               v.v = std::make_shared<Vocab>(std::move(ov), std::move(dv), std::move(eos), size);
             }
             return v;
           }),
           py::arg("offsets"), py::arg("data"), py::arg("eos"), py::arg("size"))
      .def_property_readonly("size", [](const PyVocab& v) { return v.v->size(); })
      .def_property_readonly("words", [](const PyVocab& v) { return v.v->words(); })
      .def(
          "longest_cut",
          [](const PyVocab& v, py::bytes data) {
            const std::string bytes = data;
            py::gil_scoped_release nogil;
            return v.v->longest_cut(reinterpret_cast<const uint8_t*>(bytes.data()), static_cast<int64_t>(bytes.size()));
          },
          py::arg("data"),
          "The tokens of `data` cut into the longest token at each step: an upper bound of the fewest; -1 when "
          "some byte starts no token.");

  m.def(
      "compile_masks",
      [](const PyVocab& v, py::array table, py::array accept, int nthreads) {
        int64_t S = 0;
        const int32_t* t = dfa_table(table, accept, S);
        const uint8_t* a = static_cast<const uint8_t*>(accept.data());
        py::array_t<uint32_t> out({S + 1, v.v->words()});
        uint32_t* o = out.mutable_data();
        {
          py::gil_scoped_release nogil;
          compile_masks(*v.v, t, a, S, o, nthreads);
        }
        return out;
      },
      py::arg("vocab"), py::arg("table"), py::arg("accept"), py::arg("nthreads") = 0);

  py::class_<PyGrammar>(m, "Grammar")
      .def(py::init([](const PyVocab& v, py::object table, py::array accept, py::array masks, int32_t start,
                       bool ready, py::object classes) {
             PyGrammar g;
             g.g = std::make_shared<Grammar>();
             g.g->vocab = v.v;
             int64_t S = 0;
             g.g->tr = any_table(classes, table, accept, S);
             g.g->accept = static_cast<const uint8_t*>(accept.data());
             // a lazy grammar writes its rows as they are first needed
             g.g->masks = buffer_of<uint32_t>(masks, 2, "masks", !ready);
             g.g->S = S;
             g.g->start = start;
             if (masks.shape(0) != S + 1 || masks.shape(1) != v.v->words() || masks.strides(0) != masks.shape(1) * 4 ||
                 start < 0 || start >= S)
               throw std::invalid_argument("grammar buffers do not fit the vocabulary");
             g.g->init(ready);
             g.table = table;
             g.classes = classes;
             g.accept = accept;
             g.masks = masks;
             return g;
           }),
           py::arg("vocab"), py::arg("table"), py::arg("accept"), py::arg("masks"), py::arg("start") = 0,
           py::arg("ready") = true, py::arg("classes") = py::none())
      .def_static(
          "over_lazy",
          [](const PyVocab& v, const PyLazyDfa& lazy) {
            PyGrammar g;
            g.g = Grammar::over_lazy(v.v, lazy.d, lazy.lock, lazy.d->max_states());
            return g;
          },
          py::arg("vocab"), py::arg("lazy"),
          "A grammar over a LazyDfa (shared: states the grammar builds are the LazyDfa's), rows computed on "
          "first use; its num_states is the automaton's state limit. complete, compress, rows_into, budget_row, "
          "token_distances and finish_later refuse it.")
      .def_static("compressed", &compressed_grammar, py::arg("vocab"), py::arg("classes"), py::arg("table"),
                  py::arg("accept"), py::arg("row_of"), py::arg("off"), py::arg("kind"), py::arg("data"),
                  py::arg("start") = 0, py::arg("shared") = py::tuple(),
                  "A complete grammar over compressed rows (kind 5 rows name a row of `shared`, ((kind, words), "
                  "...)) and a compressed automaton; every index checked.")
      .def_property_readonly("shared_rows", [](const PyGrammar& g) -> py::object {
        if (!g.g->compact) return py::none();
        return g.shared;
      })
      .def_property_readonly("compressed_rows", [](const PyGrammar& g) -> py::object {
        if (!g.g->compact) return py::none();
        return g.rows;
      })
      .def_property_readonly("transitions", [](const PyGrammar& g) -> py::object {
        if (!g.g->compact) return py::none();
        return py::make_tuple(g.classes, g.table);
      })
      .def(
          "compress",
          [](const PyGrammar& g, int nthreads) {
            Grammar& gr = *g.g;
            check_whole(gr, "compress");
            if (gr.compact) return g;
            for (int64_t r = 0; r <= gr.S; ++r)
              if (!gr.ready(r)) throw std::invalid_argument("compress: the grammar is not complete");
            CompactArrays a;
            uint8_t classes[256];
            Comb comb;
            {
              py::gil_scoped_release nogil;
              a = compact_rows(gr.masks, gr.S + 1, gr.vocab->words(), nthreads);
              comb = comb_of(gr.tr, gr.S, classes);
            }
            return compressed_from(g, std::move(a), classes, std::move(comb));
          },
          py::arg("nthreads") = 0,
          "A compressed copy of this complete grammar (same automaton and states); this one is unchanged.")
      .def(
          "compact_all",
          [](const PyGrammar& g, int64_t max_bytes) -> py::object {
            const Grammar& gr = *g.g;
            check_whole(gr, "compact_all");
            if (gr.compact) return py::cast(g);
            Finisher::Done done;
            {
              py::gil_scoped_release nogil;
              done = Finisher::compress(gr, max_bytes);
            }
            if (!done.complete) return py::none();
            return py::cast(compressed_from(g, std::move(done.rows), done.classes.data(), std::move(done.comb)));
          },
          py::arg("max_bytes") = INT64_MAX,
          "A compressed copy of this grammar made row by row on this thread, as the background completion "
          "makes it: ready rows are read, the others computed into a scratch row and left missing here (the "
          "dense table is never held). The same arrays as compress(); None once they pass max_bytes.")
      .def(
          "rows_into",
          [](const PyGrammar& g, py::array out, int64_t first) {
            const Grammar& gr = *g.g;
            check_whole(gr, "rows_into");
            uint32_t* o = buffer_of<uint32_t>(out, 2, "out", true);
            const int64_t W = gr.vocab->words();
            if (out.shape(1) != W || out.strides(0) != W * 4 || first < 0 || first + out.shape(0) > gr.S + 1)
              throw std::invalid_argument("rows_into: out must be uint32[n, W] with first + n <= S + 1");
            const int64_t n = out.shape(0);
            py::gil_scoped_release nogil;
            for (int64_t r = first; r < first + n; ++r) {
              gr.ensure(r);
              gr.row_words(r, 0, W, o + (r - first) * W);
            }
          },
          py::arg("out"), py::arg("first") = 0,
          "out[i] = mask row first + i (computed first if missing), from whichever form the grammar holds.")
      .def(
          "ensure",
          [](const PyGrammar& g, int64_t state) {
            const int64_t r = state < 0 ? g.g->S : state;
            if (r > g.g->S || (g.g->lazy && r < g.g->S && r >= g.g->states()))
              throw std::invalid_argument("state " + std::to_string(state) + " out of range");
            py::gil_scoped_release nogil;
            g.g->ensure(r);
          },
          py::arg("state"), "Compute the mask row of `state` (-1: the dead row) if it is not ready yet.")
      .def(
          "complete",
          [](const PyGrammar& g, int nthreads) {
            py::gil_scoped_release nogil;
            g.g->complete(nthreads);
          },
          py::arg("nthreads") = 0, "Compute every missing mask row (nthreads=1: on this thread only).")
      .def_property_readonly("ready_rows", [](const PyGrammar& g) { return g.g->ready_rows(); })
      .def(
          "finish_later",
          [](const PyGrammar& g, int64_t id, int64_t max_bytes) {
            check_whole(*g.g, "finish_later");
            if (g.g->compact) throw std::invalid_argument("finish_later: the grammar is compressed already");
            if (max_bytes <= 0) throw std::invalid_argument("finish_later: max_bytes must be positive");
            Finisher::global().enqueue(id, g.g, max_bytes);
          },
          py::arg("id"), py::arg("max_bytes"),
          "Queue the grammar for completion, compressed, by finished_next() (finished_take(id, grammar) then "
          "gives the compressed grammar, or None if its compressed rows passed max_bytes); the caller keeps its "
          "buffers alive until then.")
      .def("step",
           [](const PyGrammar& g, int64_t state, int64_t token) {
             check_state(*g.g, state);
             return g.g->step(static_cast<int32_t>(state), token);
           })
      .def("walk",
           [](const PyGrammar& g, int64_t state, const std::vector<int64_t>& tokens) {
             check_state(*g.g, state);
             int32_t s = static_cast<int32_t>(state);
             for (int64_t t : tokens) s = g.g->step(s, t);
             return s;
           })
      .def(
          "budget_row",
          [](const PyGrammar& g, int64_t state, py::array dist, int32_t k, py::array out) {
            check_state(*g.g, state);
            const Grammar& gr = *g.g;
            check_whole(gr, "budget_row");
            const int32_t* d = buffer_of<int32_t>(dist, 1, "dist", false);
            uint32_t* o = buffer_of<uint32_t>(out, 1, "out", true);
            if (dist.shape(0) != gr.S || out.shape(0) != gr.vocab->words())
              throw std::invalid_argument("budget_row: dist must be [S], out [W]");
            std::vector<int32_t> stack(gr.vocab->max_len() + 2);
            {
              py::gil_scoped_release nogil;
              gr.vocab->state_mask_within(gr.tr, static_cast<int32_t>(state), d, k, o, stack.data());
            }
            if (gr.accept[state])
              for (int32_t e : gr.vocab->eos()) o[e >> 5] |= 1u << (e & 31);
          },
          py::arg("state"), py::arg("dist"), py::arg("k"), py::arg("out"),
          "out[W] = the tokens allowed in `state` whose end state q has dist[q] <= k, and end of sequence "
          "when `state` accepts.")
      .def(
          "token_distances",
          [](const PyGrammar& g, py::array dist, py::array order) {
            const Grammar& gr = *g.g;
            check_whole(gr, "token_distances");
            int32_t* d = buffer_of<int32_t>(dist, 1, "dist", true);
            const int32_t* ord = buffer_of<int32_t>(order, 1, "order", false);
            if (dist.shape(0) != gr.S || order.shape(0) != gr.S)
              throw std::invalid_argument("token_distances: dist and order must be [S]");
            check_order(ord, gr.S);
            py::gil_scoped_release nogil;
            return lower_token_distances(*gr.vocab, gr.tr, gr.accept, gr.S, d, ord);
          },
          py::arg("dist"), py::arg("order"),
          "Lower dist[S] in place to the fewest tokens to an accepting state (dist: an upper bound, e.g. "
          "single-byte steps; order: the states in increasing dist, which makes few rounds). Returns the rounds.")
      .def_property_readonly("num_states", [](const PyGrammar& g) { return g.g->S; })
      .def_property_readonly("start", [](const PyGrammar& g) { return g.g->start; });

  m.def(
      "token_distances",
      [](const PyVocab& v, py::object table, py::array accept, py::array dist, py::array order, py::object classes) {
        int64_t S = 0;
        const Transitions tr = any_table(classes, table, accept, S);
        const uint8_t* a = static_cast<const uint8_t*>(accept.data());
        int32_t* d = buffer_of<int32_t>(dist, 1, "dist", true);
        const int32_t* ord = buffer_of<int32_t>(order, 1, "order", false);
        if (dist.shape(0) != S || order.shape(0) != S)
          throw std::invalid_argument("token_distances: dist and order must be [S]");
        check_order(ord, S);
        py::gil_scoped_release nogil;
        return lower_token_distances(*v.v, tr, a, S, d, ord);
      },
      py::arg("vocab"), py::arg("table"), py::arg("accept"), py::arg("dist"), py::arg("order"),
      py::arg("classes") = py::none(),
      "Grammar.token_distances from the automaton alone (no mask rows): what a budget check needs.");

  m.def(
      "fewest_tokens",
      [](const PyVocab& v, py::object table, py::array accept, int32_t start, py::object classes, int64_t budget_ms) {
        int64_t S = 0;
        const Transitions tr = any_table(classes, table, accept, S);
        if (start < 0 || start >= S) throw std::invalid_argument("fewest_tokens: start state out of range");
        const uint8_t* a = static_cast<const uint8_t*>(accept.data());
        py::gil_scoped_release nogil;
        const FewestTokens f = fewest_tokens(*v.v, tr, a, S, start, budget_ms);
        return std::make_pair(f.tokens, f.explored);
      },
      py::arg("vocab"), py::arg("table"), py::arg("accept"), py::arg("start"), py::arg("classes") = py::none(),
      py::arg("budget_ms") = 0,
      "(tokens, explored): the fewest tokens from `start` to an accepting state (2**31 - 1: none), from a "
      "search over the states nearer the start than that; tokens is -1 when budget_ms (> 0) ran out first, "
      "and every answer then takes more than `explored` tokens.");

  m.def(
      "pack_comb",
      [](py::array columns) {
        const int32_t* c = buffer_of<int32_t>(columns, 2, "columns", false);
        const int64_t S = columns.shape(0), C = columns.shape(1);
        if (C < 1 || C > 256 || (S > 1 && columns.strides(0) != C * 4))
          throw std::invalid_argument("pack_comb: columns must be C-contiguous int32[S, C], 1 <= C <= 256");
        for (int64_t i = 0; i < S * C; ++i)
          if (c[i] < -1 || c[i] >= S) throw std::invalid_argument("pack_comb: entry out of range");
        Comb comb;
        {
          py::gil_scoped_release nogil;
          comb = pack_comb(c, S, C);
        }
        return comb_arrays(std::move(comb));
      },
      py::arg("columns"),
      "(base int32[S], slots [N, 2]): class columns int32[S, C] packed as the comb a compressed grammar "
      "holds (csrc/comb.h; slots int16 where S <= 32,767). Releases the GIL.");

  m.def(
      "byte_distances",
      [](py::object table, py::array accept, py::array usable, py::object classes) {
        int64_t S = 0;
        const Transitions tr = any_table(classes, table, accept, S);
        const uint8_t* u = buffer_of<uint8_t>(usable, 1, "usable", false);
        if (usable.shape(0) != 256) throw std::invalid_argument("byte_distances: usable must be [256]");
        py::array_t<int32_t> dist(S);
        int32_t* d = dist.mutable_data();
        const uint8_t* a = static_cast<const uint8_t*>(accept.data());
        {
          py::gil_scoped_release nogil;
          byte_distances(tr, a, S, u, d);
        }
        return dist;
      },
      py::arg("table"), py::arg("accept"), py::arg("usable"), py::arg("classes") = py::none(),
      "int32[S]: per state, the fewest steps over the bytes with usable[b] (uint8[256]) to an accepting state "
      "(2**31 - 1: none).");

  m.def(
      "tree_facts",
      [](py::array ast, py::array usable, int64_t cap, int64_t budget_ms) {
        const int32_t* a = buffer_of<int32_t>(ast, 1, "ast", false);
        const uint8_t* u = buffer_of<uint8_t>(usable, 1, "usable", false);
        if (usable.shape(0) != 256) throw std::invalid_argument("tree_facts: usable must be [256]");
        if (cap < 0) throw std::invalid_argument("tree_facts: cap must be >= 0");
        TreeFacts f;
        try {
          py::gil_scoped_release nogil;
          Budget budget(budget_ms, 0);
          f = tree_facts(a, ast.shape(0), u, cap, budget);
        } catch (const DfaError& e) {
          throw py::value_error(e.message);
        }
        py::object answer = f.answers ? py::object(py::bytes(f.answer)) : py::object(py::none());
        return py::make_tuple(f.states, f.moves, answer);
      },
      py::arg("ast"), py::arg("usable"), py::arg("cap"), py::arg("budget_ms") = 0,
      "(states, moves, answer) of the NFA that LazyDfa and compile would build from `ast` (serialised, see "
      "dfa.h), found without building it (csrc/tree_facts.h): its states and moves (epsilon and byte) exactly; "
      "answer: one shortest string of its language over the bytes with usable[b] (uint8[256]), None when there "
      "is none. Past `cap` states the walk stops: states = cap + 1, moves 0, answer None.");

  m.def(
      "greedy_tokens",
      [](const PyVocab& v, py::object table, py::array accept, int32_t start, py::object classes) {
        int64_t S = 0;
        const Transitions tr = any_table(classes, table, accept, S);
        if (start < 0 || start >= S) throw std::invalid_argument("greedy_tokens: start state out of range");
        const uint8_t* a = static_cast<const uint8_t*>(accept.data());
        py::gil_scoped_release nogil;
        return greedy_tokens(*v.v, tr, a, S, start);
      },
      py::arg("vocab"), py::arg("table"), py::arg("accept"), py::arg("start"), py::arg("classes") = py::none(),
      "The tokens of one answer from `start` (a shortest one in bytes, cut into the longest tokens): an upper "
      "bound of the fewest. 2**31 - 1: no answer; -1: a byte of it starts no token.");

  m.def(
      "shortest_answer",
      [](const PyVocab& v, py::object table, py::array accept, int32_t start, py::object classes) -> py::object {
        int64_t S = 0;
        const Transitions tr = any_table(classes, table, accept, S);
        if (start < 0 || start >= S) throw std::invalid_argument("shortest_answer: start state out of range");
        const uint8_t* a = static_cast<const uint8_t*>(accept.data());
        std::vector<uint8_t> answer;
        bool found = false;
        {
          py::gil_scoped_release nogil;
          found = shortest_answer(*v.v, tr, a, S, start, answer);
        }
        if (!found) return py::none();
        return py::bytes(reinterpret_cast<const char*>(answer.data()), answer.size());
      },
      py::arg("vocab"), py::arg("table"), py::arg("accept"), py::arg("start"), py::arg("classes") = py::none(),
      "The bytes of one shortest answer from `start` (what greedy_tokens cuts), over bytes that are tokens by "
      "themselves where those reach acceptance; None: no answer.");

  m.def(
      "token_path",
      [](const PyVocab& v, py::object table, py::array accept, int32_t start, py::bytes answer,
         py::object classes) -> py::object {
        int64_t S = 0;
        const Transitions tr = any_table(classes, table, accept, S);
        if (start < 0 || start >= S) throw std::invalid_argument("token_path: start state out of range");
        const uint8_t* a = static_cast<const uint8_t*>(accept.data());
        const std::string bytes = answer;
        std::vector<int32_t> path;
        {
          py::gil_scoped_release nogil;
          path = v.v->token_path(
              tr, [a](int32_t q) { return a[q] != 0; }, start, reinterpret_cast<const uint8_t*>(bytes.data()),
              static_cast<int64_t>(bytes.size()));
        }
        if (path.empty()) return py::none();
        return py::array_t<int32_t>(static_cast<py::ssize_t>(path.size()), path.data());
      },
      py::arg("vocab"), py::arg("table"), py::arg("accept"), py::arg("start"), py::arg("answer"),
      py::arg("classes") = py::none(),
      "The states where the tokens of `answer` (cut into the longest tokens) start, walked from `start`, then the "
      "state it ends in (int32[tokens + 1]); None when a byte starts no token, the walk leaves the automaton or "
      "its end does not accept.");

  py::class_<PyBatch>(m, "Batch")
      .def(py::init<const PyVocab&>())
      .def("set_row", &PyBatch::set_row, py::arg("index"), py::arg("grammar"), py::arg("tokens"))
      .def("clear_row", &PyBatch::clear_row)
      .def("move", &PyBatch::move, py::arg("src"), py::arg("dst"))
      .def("swap", &PyBatch::swap)
      .def("sync", &PyBatch::sync, py::arg("n"))
      .def("fill", &PyBatch::fill, py::arg("out"), py::arg("active") = py::none(), py::arg("n") = -1,
           py::arg("nthreads") = 0)
      .def("fill_apply", &PyBatch::fill_apply, py::arg("logits"), py::arg("out") = py::none(),
           py::arg("nthreads") = 0)
      .def("row", &PyBatch::row)
      .def_property_readonly("capacity", &PyBatch::size);

  m.def(
      "compact_rows",
      [](py::array masks, int nthreads) {
        const uint32_t* m = buffer_of<uint32_t>(masks, 2, "masks", false);
        if (masks.shape(0) > 0 && masks.strides(0) != masks.shape(1) * 4)
          throw std::invalid_argument("masks must be C-contiguous");
        if (masks.shape(1) <= 0 || masks.shape(0) >= (int64_t(1) << 31)) throw std::invalid_argument("masks: shape");
        CompactArrays a;
        {
          py::gil_scoped_release nogil;
          a = compact_rows(m, masks.shape(0), masks.shape(1), nthreads);
        }
        return compact_to_numpy(std::move(a));
      },
      py::arg("masks"), py::arg("nthreads") = 0,
      "masks uint32[N, W] -> (row_of int32[N], off int64[R+1], kind uint8[R], data uint32[off[R]]): each "
      "distinct row once, in its smallest form (see csrc/grammar.h). Releases the GIL.");

  m.def(
      "finished_next",
      [] {
        py::gil_scoped_release nogil;
        return Finisher::global().next_done();
      },
      "Wait (without the GIL) for a queued grammar, compress all its rows on this thread (computing those "
      "not computed yet one at a time, never all of them dense), return its id.");
  m.def(
      "finished_take",
      [](int64_t id, const py::object& grammar) -> py::object {
        std::unique_ptr<Finisher::Done> done = Finisher::global().take(id);
        if (done && !done->error.empty() && !grammar.is_none())
          throw std::runtime_error("completing the constraint failed: " + done->error);
        if (!done || !done->complete || grammar.is_none()) return py::none();
        const PyGrammar& g = cast_to<PyGrammar>(grammar, "grammar");
        if (g.g->compact || g.g->S + 1 != static_cast<int64_t>(done->rows.row_of.size()))
          throw std::invalid_argument("finished_take: not the grammar queued as this id");
        return py::cast(compressed_from(g, std::move(done->rows), done->classes.data(), std::move(done->comb)));
      },
      py::arg("id"), py::arg("grammar"),
      "The compressed grammar finished_next() made of `grammar` (queued as `id`): same automaton and states; "
      "None if its compressed rows passed the max_bytes it was queued with (it stays lazy); RuntimeError if "
      "completing it failed (out of memory). Taken once; grammar=None drops the result.");

  m.def(
      "build_dfa",
      [](py::array ast, int64_t max_states, int64_t max_nfa_states, int64_t budget_ms, int64_t budget_bytes,
         bool classes) -> py::tuple {
        const int32_t* a = buffer_of<int32_t>(ast, 1, "ast", false);
        const int64_t n = ast.shape(0);
        check_state_limits(max_states, max_nfa_states);
        Dfa d;
        std::unique_ptr<int32_t[]> bytes;
        try {
          py::gil_scoped_release nogil;
          Budget budget(budget_ms, budget_bytes);
          {
            Nfa nfa = build_nfa(a, n, max_nfa_states, budget);
            Dfa raw = determinize(nfa.view(), max_states, budget);
            budget.check_time();
            d = minimize(raw, budget);
          }
          bytes = byte_table(d, classes, budget);
        } catch (const DfaError& e) {
          throw py::value_error(e.message);
        }
        return dfa_arrays(d, std::move(bytes), classes);
      },
      py::arg("ast"), py::arg("max_states"), py::arg("max_nfa_states"), py::arg("budget_ms") = 0,
      py::arg("budget_bytes") = 0, py::arg("classes") = false,
      "Regular-expression AST (serialised, see dfa.h) -> minimal byte DFA: (table int32[S,256], accept uint8[S]), "
      "or with classes=True (classes uint8[256], table int32[S,C], accept uint8[S]), C the byte classes.");

  m.def(
      "intersect_dfas",
      [](const std::vector<py::array>& tables, const std::vector<py::array>& accepts, const std::vector<int64_t>& starts,
         int64_t max_product_states, int64_t budget_ms, int64_t budget_bytes, bool classes) -> py::tuple {
        if (tables.empty() || accepts.size() != tables.size() || starts.size() != tables.size())
          throw std::invalid_argument("intersect_dfas: one table, accept array and start per automaton");
        if (max_product_states <= 0 || max_product_states >= (int64_t(1) << 31))
          throw std::invalid_argument("max_product_states must be in [1, 2^31)");
        std::vector<ByteTableView> inputs;
        for (size_t i = 0; i < tables.size(); ++i) {
          py::array table = tables[i], accept = accepts[i];
          ByteTableView in;
          in.table = buffer_of<int32_t>(table, 2, "table", false);
          in.accept = buffer_of<uint8_t>(accept, 1, "accept", false);
          in.states = table.shape(0);
          if (table.shape(1) != 256 || (in.states > 1 && table.strides(0) != 256 * 4) || accept.shape(0) != in.states)
            throw std::invalid_argument("intersect_dfas: tables int32[S, 256] (C-contiguous) with accept uint8[S]");
          if (starts[i] < 0 || starts[i] >= in.states) throw std::invalid_argument("intersect_dfas: start out of range");
          in.start = static_cast<int32_t>(starts[i]);
          for (int64_t j = 0; j < in.states * 256; ++j)
            if (in.table[j] < -1 || in.table[j] >= in.states)
              throw std::invalid_argument("intersect_dfas: a transition out of range");
          inputs.push_back(in);
        }
        Dfa d;
        std::unique_ptr<int32_t[]> bytes;
        try {
          py::gil_scoped_release nogil;
          Budget budget(budget_ms, budget_bytes);
          d = intersect(inputs, max_product_states, budget);
          bytes = byte_table(d, classes, budget);
        } catch (const DfaError& e) {
          throw py::value_error(e.message);
        }
        return dfa_arrays(d, std::move(bytes), classes);
      },
      py::arg("tables"), py::arg("accepts"), py::arg("starts"), py::arg("max_product_states"),
      py::arg("budget_ms") = 0, py::arg("budget_bytes") = 0, py::arg("classes") = false,
      "Byte DFAs (tables int32[S_i,256], accepts uint8[S_i], starts) -> the minimal DFA of the strings all accept, "
      "as build_dfa returns it. ValueError past max_product_states product states, a budget, or when no string "
      "is accepted by all.");

  py::class_<PyLazyDfa>(m, "LazyDfa")
      .def(py::init([](py::array ast, int64_t max_states, int64_t max_nfa_states, int64_t budget_ms,
                       int64_t budget_bytes, int64_t call_ms) {
             const int32_t* a = buffer_of<int32_t>(ast, 1, "ast", false);
             const int64_t n = ast.shape(0);
             check_state_limits(max_states, max_nfa_states);
             PyLazyDfa out;
             try {
               py::gil_scoped_release nogil;
               out.d = std::make_shared<LazyDfa>(a, n, max_states, max_nfa_states, budget_ms, budget_bytes, call_ms);
             } catch (const DfaError& e) {
               throw py::value_error(e.message);
             }
             return out;
           }),
           py::arg("ast"), py::arg("max_states"), py::arg("max_nfa_states"), py::arg("budget_ms") = 0,
           py::arg("budget_bytes") = 0, py::arg("call_ms") = 0,
           "Regular-expression AST (serialised, see dfa.h) -> its byte DFA, states built as walks reach them "
           "(csrc/lazy_dfa.h); the NFA is built now, within budget_ms; each later call within call_ms.")
      .def(
          "walk",
          [](PyLazyDfa& self, py::bytes data, int64_t state) {
            const std::string bytes = data;
            int32_t s = -1;
            try {
              py::gil_scoped_release nogil;
              std::lock_guard<std::mutex> hold(*self.lock);
              s = self.checked(state);
              self.d->restart();
              for (unsigned char b : bytes) {
                s = self.d->next(s, b);
                if (s < 0) break;
              }
            } catch (const DfaError& e) {
              throw py::value_error(e.message);
            }
            return s;
          },
          py::arg("data"), py::arg("state") = 0, "The state after `data` from `state` (-1: dead).")
      .def(
          "mask_row",
          [](PyLazyDfa& self, const PyVocab& v, int64_t state, py::array out) {
            uint32_t* o = buffer_of<uint32_t>(out, 1, "out", true);
            if (out.shape(0) != v.v->words()) throw std::invalid_argument("out must hold vocab.words words");
            try {
              py::gil_scoped_release nogil;
              std::lock_guard<std::mutex> hold(*self.lock);
              self.d->mask_row(*v.v, self.checked(state), o);
            } catch (const DfaError& e) {
              throw py::value_error(e.message);
            }
          },
          py::arg("vocab"), py::arg("state"), py::arg("out"),
          "Write the packed mask row of `state` into out (uint32[vocab.words]), as a Grammar computes it.")
      .def(
          "byte_distance",
          [](PyLazyDfa& self, int64_t state, py::array usable) {
            const uint8_t* u = buffer_of<uint8_t>(usable, 1, "usable", false);
            if (usable.shape(0) != 256) throw std::invalid_argument("usable must hold 256 flags");
            py::gil_scoped_release nogil;
            std::lock_guard<std::mutex> hold(*self.lock);
            return self.d->byte_distance(self.checked(state), u);
          },
          py::arg("state"), py::arg("usable"),
          "The fewest bytes from `state` to acceptance over the bytes b with usable[b] (uint8[256]); "
          "2**31 - 1: none. Builds no state.")
      .def(
          "max_byte_distance",
          [](PyLazyDfa& self, py::array usable) {
            const uint8_t* u = buffer_of<uint8_t>(usable, 1, "usable", false);
            if (usable.shape(0) != 256) throw std::invalid_argument("usable must hold 256 flags");
            py::gil_scoped_release nogil;
            std::lock_guard<std::mutex> hold(*self.lock);
            return self.d->max_byte_distance(u);
          },
          py::arg("usable"),
          "An upper bound (not the exact maximum) of byte_distance(q, usable) over every state q the "
          "automaton can build whose distance is finite; 0 when none is. Builds no state.")
      .def(
          "budget_row",
          [](PyLazyDfa& self, const PyVocab& v, int64_t state, py::array usable, int32_t k, py::array out) {
            const uint8_t* u = buffer_of<uint8_t>(usable, 1, "usable", false);
            if (usable.shape(0) != 256) throw std::invalid_argument("usable must hold 256 flags");
            uint32_t* o = buffer_of<uint32_t>(out, 1, "out", true);
            if (out.shape(0) != v.v->words()) throw std::invalid_argument("out must hold vocab.words words");
            try {
              py::gil_scoped_release nogil;
              std::lock_guard<std::mutex> hold(*self.lock);
              self.d->budget_row(*v.v, self.checked(state), u, k, o);
            } catch (const DfaError& e) {
              throw py::value_error(e.message);
            }
          },
          py::arg("vocab"), py::arg("state"), py::arg("usable"), py::arg("k"), py::arg("out"),
          "out (uint32[vocab.words]) = the tokens whose bytes walk from `state` to a state q with "
          "steering_distance(q, usable) <= k, and end of sequence when `state` accepts: Grammar.budget_row "
          "with dist = steering_distance, building the states the walk reaches.")
      .def(
          "fewest_tokens",
          [](PyLazyDfa& self, const PyVocab& v, int64_t state, int64_t budget_ms) {
            FewestTokens f{};
            try {
              py::gil_scoped_release nogil;
              std::lock_guard<std::mutex> hold(*self.lock);
              const int32_t s = self.checked(state);
              self.d->restart();
              f = fewest_tokens_in(*v.v, *self.d, s, budget_ms);
            } catch (const DfaError& e) {
              // the automaton's own time limit ran out first: a lower bound, as when budget_ms does
              if (e.message.find("time budget") != std::string::npos) return std::make_pair(-1, 0);
              throw py::value_error(e.message);
            }
            return std::make_pair(f.tokens, f.explored);
          },
          py::arg("vocab"), py::arg("state") = 0, py::arg("budget_ms") = 0,
          "As fewest_tokens over a whole automaton (same result), building the states the search reaches.")
      .def(
          "greedy_tokens",
          [](PyLazyDfa& self, const PyVocab& v, int64_t state) {
            try {
              py::gil_scoped_release nogil;
              std::lock_guard<std::mutex> hold(*self.lock);
              return self.d->greedy_tokens(*v.v, self.checked(state));
            } catch (const DfaError& e) {
              throw py::value_error(e.message);
            }
          },
          py::arg("vocab"), py::arg("state") = 0,
          "As greedy_tokens over a whole automaton: the tokens of one answer (an upper bound of the fewest); "
          "2**31 - 1: none; -1: a byte of it starts no token.")
      .def(
          "occurs",
          [](PyLazyDfa& self, const std::vector<py::bytes>& texts, int64_t max_steps) {
            std::vector<std::string> held(texts.begin(), texts.end());
            py::gil_scoped_release nogil;
            std::lock_guard<std::mutex> hold(*self.lock);
            return self.d->occurs(held, max_steps);
          },
          py::arg("texts"), py::arg("max_steps"),
          "Per text (bytes), whether it occurs inside some answer (a factor of a string of the language): 1 "
          "yes, 0 no, -1 not decided within max_steps NFA moves read in all. Builds no state.")
      .def(
          "shortest_answer",
          [](PyLazyDfa& self, const PyVocab& v, int64_t state) -> py::object {
            std::vector<uint8_t> answer;
            bool found = false;
            try {
              py::gil_scoped_release nogil;
              std::lock_guard<std::mutex> hold(*self.lock);
              found = self.d->shortest_answer(*v.v, self.checked(state), answer);
            } catch (const DfaError& e) {
              throw py::value_error(e.message);
            }
            if (!found) return py::none();
            return py::bytes(reinterpret_cast<const char*>(answer.data()), answer.size());
          },
          py::arg("vocab"), py::arg("state") = 0,
          "The bytes of one shortest answer from `state` (what greedy_tokens cuts), building the states along it; "
          "None: no answer.")
      .def(
          "add_answer",
          [](PyLazyDfa& self, const PyVocab& v, int64_t state, py::bytes answer) {
            const std::string bytes = answer;
            try {
              py::gil_scoped_release nogil;
              std::lock_guard<std::mutex> hold(*self.lock);
              return self.d->add_answer(*v.v, self.checked(state), reinterpret_cast<const uint8_t*>(bytes.data()),
                                        static_cast<int64_t>(bytes.size()));
            } catch (const DfaError& e) {
              throw py::value_error(e.message);
            }
          },
          py::arg("vocab"), py::arg("state"), py::arg("answer"),
          "Record `answer` (bytes, cut into the longest tokens) as an answer from `state` for steering: every state "
          "where one of its tokens starts can end within the tokens left (steering_distance, budget_row). Its "
          "tokens; -1 when it is not an answer from `state` (nothing recorded).")
      .def(
          "steering_distance",
          [](PyLazyDfa& self, int64_t state, py::array usable) {
            const uint8_t* u = buffer_of<uint8_t>(usable, 1, "usable", false);
            if (usable.shape(0) != 256) throw std::invalid_argument("usable must hold 256 flags");
            py::gil_scoped_release nogil;
            std::lock_guard<std::mutex> hold(*self.lock);
            return self.d->steering_distance(self.checked(state), u);
          },
          py::arg("state"), py::arg("usable"),
          "What budget_row steers by: the least of byte_distance(state, usable) and the tokens left of an answer "
          "recorded through `state` (add_answer). Builds no state.")
      .def(
          "max_steering_distance",
          [](PyLazyDfa& self, py::array usable) {
            const uint8_t* u = buffer_of<uint8_t>(usable, 1, "usable", false);
            if (usable.shape(0) != 256) throw std::invalid_argument("usable must hold 256 flags");
            py::gil_scoped_release nogil;
            std::lock_guard<std::mutex> hold(*self.lock);
            return self.d->max_steering_distance(u);
          },
          py::arg("usable"),
          "An upper bound of every finite steering_distance(q, usable): max_byte_distance, or the most tokens of a "
          "recorded answer. Builds no state.")
      .def("accepting",
           [](const PyLazyDfa& self, int64_t s) {
             const int32_t state = self.checked(s);
             py::gil_scoped_release nogil;
             std::lock_guard<std::mutex> hold(*self.lock);
             return self.d->accepting(state);
           })
      .def_property_readonly("found", [](const PyLazyDfa& self) { return self.d->found(); })
      .def_property_readonly("expanded",
                             [](const PyLazyDfa& self) {
                               py::gil_scoped_release nogil;
                               std::lock_guard<std::mutex> hold(*self.lock);
                               return self.d->expanded();
                             })
      .def_property_readonly("letters", [](const PyLazyDfa& self) { return self.d->letters(); })
      .def_property_readonly(
          "exhausted", [](const PyLazyDfa& self) { return self.d->exhausted(); },
          "A state could not be built within a limit: answers reaching it over a grammar have ended.")
      .def_property_readonly(
          "full", [](const PyLazyDfa& self) { return self.d->full(); },
          "A state could not be built for the state or memory limit: no later call builds one either.")
      .def_property_readonly(
          "nfa_size", [](const PyLazyDfa& self) { return self.d->nfa_size(); },
          "(states, moves) of its NFA: epsilon moves and byte edges together.")
      .def_property_readonly("nbytes", [](const PyLazyDfa& self) {
        py::gil_scoped_release nogil;
        std::lock_guard<std::mutex> hold(*self.lock);
        return self.d->bytes();
      });

  m.def(
      "checksum",
      [](py::buffer data, uint64_t seed) {
        py::buffer_info info = data.request();
        if (info.ndim > 0) {  // C-contiguous only: the checksum is over the bytes in memory order
          py::ssize_t expect = info.itemsize;
          for (py::ssize_t k = info.ndim - 1; k >= 0; --k) {
            if (info.shape[k] > 1 && info.strides[k] != expect) throw std::invalid_argument("checksum: data must be C-contiguous");
            expect *= info.shape[k];
          }
        }
        const auto* p = static_cast<const uint8_t*>(info.ptr);
        const int64_t n = static_cast<int64_t>(info.size * info.itemsize);
        py::gil_scoped_release nogil;
        return checksum(p, n, seed);
      },
      py::arg("data"), py::arg("seed") = 0, "64-bit checksum of a C-contiguous buffer (definition in csrc/checksum.h).");

  m.def(
      "apply_bitmask",
      [](py::array logits, py::array bitmask, py::object active, int nthreads) {
        float* l = buffer_of<float>(logits, 2, "logits", true);
        const uint32_t* b = buffer_of<uint32_t>(bitmask, 2, "bitmask", false);
        const int64_t B = logits.shape(0), V = logits.shape(1);
        if (B > 1 && (logits.strides(0) % 4 != 0 || logits.strides(0) / 4 < V))
          throw std::invalid_argument("logits: rows overlap");
        if (bitmask.shape(0) < B || bitmask.shape(1) * 32 < V || bitmask.strides(0) != bitmask.shape(1) * 4)
          throw std::invalid_argument("bitmask does not fit the logits");
        const uint8_t* act = nullptr;
        py::array act_arr;
        if (!active.is_none()) {
          act_arr = active.cast<py::array>();
          act = buffer_of<uint8_t>(act_arr, 1, "active", false);
          if (act_arr.shape(0) < B) throw std::invalid_argument("active too short");
        }
        const int64_t stride = logits.strides(0) / 4, W = bitmask.shape(1);
        py::gil_scoped_release nogil;
        apply_bitmask(l, B, V, stride, b, W, act, nthreads);
      },
      py::arg("logits"), py::arg("bitmask"), py::arg("active") = py::none(), py::arg("nthreads") = 0);
}
