/* ThresholdWatchers (purgatory/_thresholds.py): one key's watchers when some wait at a threshold.
 *
 * The reference keeps its queue of thresholds in two Python containers, a deque (the *run*,
 * increasing by construction) and a list ordered by `heapq`. Here the threshold object owns
 * both as C arrays: the run a ring of strong references, the heap `heapq`'s own layout, sifted
 * by the same steps as `_heapq` (the same comparisons, in the same order, the same result), so
 * that a release takes the same thresholds in the same order as the reference and a threshold's
 * own comparison, user code, sees the same sequence of calls on both builds. `plain` and `at`
 * stay dicts (the reference's, seen from Python as they are).
 *
 * A comparison is a door (purgatory/_csrc/README.md): it may release, cancel or grow this very
 * key, or drop the last reference to it. Every entry holds the object across its work; a sift
 * holds the two values it compares and reads the array again after each comparison, stopping
 * with `_heapq`'s RuntimeError if the heap's size changed meanwhile (as the reference's heapq
 * does on its list). */

typedef struct {
    CORE_HEAD
    PyObject *plain; /* dict: the plain watchers (watched without a threshold, or released) */
    PyObject *at;    /* dict: threshold -> its operation, or a list of them in watch order */
    PyObject *shape; /* the shape every queued threshold has (the reference's check) */
    Py_ssize_t dead; /* queued thresholds no longer in `at` */
    PyObject **run;  /* the run: a ring of `run_cap` (a power of two) slots from `run_head` */
    Py_ssize_t run_head, run_len, run_cap;
    PyObject **heap; /* the heap: heapq's layout */
    Py_ssize_t heap_len, heap_cap;
    size_t run_changes; /* bumped as the run changes (a compaction's check, as deque's) */
} ThresholdObject;

/* Its owned object fields; the run and the heap (C arrays of objects) are the lifecycle's
 * hand-written part (`threshold_queue_visit` / `threshold_queue_forget`). `at` is what says the
 * object is set up (`threshold_ready`): cleared first, so that a method called while the others
 * are released (or after) takes the path of a threshold not set up. */
#define THRESHOLD_FIELDS(X) X(at) X(plain) X(shape)

#define Threshold_Check(o) CORE_CHECK((o), ThresholdType)
#define RUN_AT(t, i) ((t)->run[((t)->run_head + (i)) & ((t)->run_cap - 1)])

/* Defined with the watcher lists (watchers.c): `lists.left(op)`, an entry of `op` gone, and
 * `op._state` read as the lists read an entry. */
static int release_left(NativeState *st, PyObject *lists, PyObject *op);
static inline int entry_state(NativeState *st, PyObject *o, int *state);

/* -- the run ------------------------------------------------------------------------------------ */

static int
marks_run_append(ThresholdObject *t, PyObject *threshold)
{
    if (t->run_len == t->run_cap) {
        Py_ssize_t cap = t->run_cap ? t->run_cap * 2 : 8;
        PyObject **grown = PyMem_New(PyObject *, cap);
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        for (Py_ssize_t i = 0; i < t->run_len; i++) {
            grown[i] = RUN_AT(t, i);
        }
        PyMem_Free(t->run);
        t->run = grown;
        t->run_head = 0;
        t->run_cap = cap;
    }
    t->run_len++;
    RUN_AT(t, t->run_len - 1) = Py_NewRef(threshold);
    t->run_changes++;
    return 0;
}

/* The run's head, taken off (a new reference); the run is not empty. */
static PyObject *
marks_run_popleft(ThresholdObject *t)
{
    PyObject *head = RUN_AT(t, 0);
    t->run_head = (t->run_head + 1) & (t->run_cap - 1);
    t->run_len--;
    t->run_changes++;
    return head;
}

/* -- the heap: _heapq's siftdown / siftup over the C array -------------------------------------- */

static int
marks_changed(ThresholdObject *t, Py_ssize_t size)
{
    if (size != t->heap_len) {
        PyErr_SetString(PyExc_RuntimeError, "list changed size during iteration");
        return 1;
    }
    return 0;
}

/* Move heap[pos] up towards `start` while it is below its parent (`_heapq.siftdown`). */
static int
marks_siftdown(ThresholdObject *t, Py_ssize_t start, Py_ssize_t pos)
{
    Py_ssize_t size = t->heap_len;
    while (pos > start) {
        Py_ssize_t parentpos = (pos - 1) >> 1;
        PyObject *item = Py_NewRef(t->heap[pos]), *parent = Py_NewRef(t->heap[parentpos]);
        int lower = compare_values(item, parent, Py_LT);
        Py_DECREF(parent);
        Py_DECREF(item);
        if (lower < 0 || marks_changed(t, size)) {
            return -1;
        }
        if (!lower) {
            break;
        }
        PyObject **arr = t->heap; /* (read again: the comparison may have moved it) */
        PyObject *swap = arr[parentpos];
        arr[parentpos] = arr[pos];
        arr[pos] = swap;
        pos = parentpos;
    }
    return 0;
}

/* Move heap[pos] down to a leaf by the smaller child, then back up (`_heapq.siftup`). */
static int
marks_siftup(ThresholdObject *t, Py_ssize_t pos)
{
    Py_ssize_t end = t->heap_len, start = pos, limit = end >> 1;
    while (pos < limit) {
        Py_ssize_t child = 2 * pos + 1;
        if (child + 1 < end) {
            PyObject *a = Py_NewRef(t->heap[child]), *b = Py_NewRef(t->heap[child + 1]);
            int lower = compare_values(a, b, Py_LT);
            Py_DECREF(a);
            Py_DECREF(b);
            if (lower < 0 || marks_changed(t, end)) {
                return -1;
            }
            child += lower ^ 1;
        }
        PyObject **arr = t->heap;
        PyObject *swap = arr[child];
        arr[child] = arr[pos];
        arr[pos] = swap;
        pos = child;
    }
    return marks_siftdown(t, start, pos);
}

/* heapq.heappush(heap, threshold): on an error the value may stay anywhere in the heap. */
static int
marks_push(ThresholdObject *t, PyObject *threshold)
{
    if (t->heap_len == t->heap_cap) {
        Py_ssize_t cap = t->heap_cap ? t->heap_cap * 2 : 8;
        PyObject **grown = PyMem_Resize(t->heap, PyObject *, cap);
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        t->heap = grown;
        t->heap_cap = cap;
    }
    t->heap[t->heap_len++] = Py_NewRef(threshold);
    return marks_siftdown(t, 0, t->heap_len - 1);
}

/* heapq.heappop(heap) for a heap that is not empty: the head (a new reference), or NULL. */
static PyObject *
marks_pop(ThresholdObject *t)
{
    PyObject *last = t->heap[--t->heap_len];
    if (t->heap_len == 0) {
        return last;
    }
    PyObject *head = t->heap[0];
    t->heap[0] = last;
    if (marks_siftup(t, 0) < 0) {
        Py_DECREF(head);
        return NULL;
    }
    return head;
}

/* heapq.heapify (the reference's rebuilds: values that ordered against each other already). */
static int
marks_heapify(ThresholdObject *t)
{
    for (Py_ssize_t i = (t->heap_len >> 1) - 1; i >= 0; i--) {
        if (i >= t->heap_len) { /* (emptied by a comparison: `_heapq`'s message) */
            PyErr_SetString(PyExc_IndexError, "index out of range");
            return -1;
        }
        if (marks_siftup(t, i) < 0) {
            return -1;
        }
    }
    return 0;
}

/* Undo a push of `threshold` that raised (`ThresholdWatchers.unpush`). */
static int
marks_unpush(ThresholdObject *t, PyObject *threshold)
{
    for (Py_ssize_t i = t->heap_len - 1; i >= 0; i--) {
        if (t->heap[i] == threshold) {
            PyObject *gone = t->heap[i];
            memmove(&t->heap[i], &t->heap[i + 1], (t->heap_len - i - 1) * sizeof(PyObject *));
            t->heap_len--;
            Py_DECREF(gone); /* (the caller holds `threshold`: no code runs) */
            break;
        }
    }
    return marks_heapify(t);
}

/* ThresholdWatchers.recount(): the dead entries counted again from the queue and `at` (every
 * threshold in `at` is queued), after a sift that user code interrupted. */
static void
threshold_recount(ThresholdObject *t)
{
    t->dead = t->run_len + t->heap_len - (t->at != NULL ? PyDict_GET_SIZE(t->at) : 0);
}

/* Raise `exc` (taken), or, if `failed` (-1), the error raised since with `exc` as its context
 * (what Python shows for an error in an `except` block). Always -1. */
static int
raise_after(PyObject *exc, int failed)
{
    if (failed < 0) {
        PyObject *later = fetch_exception();
        if (later != exc) { /* (the same error raised again: no context of itself, as Python) */
            PyException_SetContext(later, exc); /* (steals exc) */
        }
        else {
            Py_DECREF(exc);
        }
        restore_exception(later);
    }
    else {
        restore_exception(exc);
    }
    return -1;
}

/* ThresholdWatchers.push(threshold): into the heap, taken out again if the push raised (its
 * sift may have left it anywhere), and the dead entries counted again: a comparison in the
 * sift may have triggered the key, whose release can pop `threshold` before it is in `at`.
 * 0, or -1 with nothing queued. */
static int
threshold_push(ThresholdObject *t, PyObject *threshold)
{
    if (marks_push(t, threshold) == 0) {
        return 0;
    }
    PyObject *exc = fetch_exception();
    int err = marks_unpush(t, threshold);
    threshold_recount(t);
    return raise_after(exc, err);
}

/* Queue a new `threshold`: the run's tail if the heap is empty and it is at least the run's
 * last, else the heap. 0, or -1 with nothing queued. */
static int
threshold_queue(ThresholdObject *t, PyObject *threshold)
{
    int in_run = t->heap_len == 0;
    if (in_run && t->run_len) {
        PyObject *last = Py_NewRef(RUN_AT(t, t->run_len - 1));
        in_run = compare_values(last, threshold, Py_LE);
        Py_DECREF(last);
        if (in_run < 0) {
            return -1;
        }
    }
    return in_run ? marks_run_append(t, threshold) : threshold_push(t, threshold);
}

/* -- marks ---------------------------------------------------------------------------------- */

/* The reference's `threshold_of(o, key)` while the state has not pulled it yet (a method of the
 * type called before any C body ran, or on a module other than the package's): imported by name
 * (the package is whole by then), not kept. */
static PyObject *
threshold_of_cold(PyObject *o, PyObject *key)
{
    PyObject *module = PyImport_ImportModule("purgatory._thresholds");
    if (module == NULL) {
        return NULL;
    }
    PyObject *r = PyObject_CallMethod(module, "threshold_of", "OO", o, key);
    Py_DECREF(module);
    return r;
}

/* The threshold of `op` on `key` (a new reference; None: plain), from its marks. The lookup runs
 * the key's __eq__, which may replace the marks (a trigger of another key releases `op` there):
 * the dict is held across it. Not an operation: the reference's `threshold_of`. */
static PyObject *
op_threshold_of(NativeState *st, PyObject *o, PyObject *key)
{
    if (!Op_Check(o)) {
        return N.threshold_of != NULL ? call2(N.threshold_of, o, key) : threshold_of_cold(o, key);
    }
    PyObject *marks = ((OpObject *)o)->marks;
    if (marks == NULL || marks == Py_None) {
        Py_RETURN_NONE;
    }
    if (PyDict_CheckExact(marks)) {
        Py_INCREF(marks);
        PyObject *t = PyDict_GetItemWithError(marks, key);
        Py_XINCREF(t);
        Py_DECREF(marks);
        if (t == NULL) {
            if (PyErr_Occurred()) {
                return NULL;
            }
            Py_RETURN_NONE;
        }
        return t;
    }
    return Py_NewRef(marks);
}

/* -- the container's steps (the reference's methods) ------------------------------------------ */

/* `plain` and `at` are dicts from __init__ on, never replaced but by __init__ (read-only from
 * Python): NULL only before it, or once a collection cleared the object. */
static inline int
threshold_ready(PyObject *o)
{
    return ((ThresholdObject *)o)->at != NULL && ((ThresholdObject *)o)->plain != NULL;
}

/* `t.plain` or `t.at` as it is now (a new reference), or NULL with an error: read again after
 * any code that could have cleared the object. */
static PyObject *
threshold_dict(ThresholdObject *t, PyObject *dict)
{
    if (dict == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "ThresholdWatchers cleared while in use");
        return NULL;
    }
    return Py_NewRef(dict);
}

/* `waiting`, the operation(s) at a threshold, with `op` added: 1 (added), 0 (there already), -1.
 * Both held by the caller. */
static int
waiting_join(PyObject *at, PyObject *threshold, PyObject *waiting, PyObject *op)
{
    if (waiting == op) {
        return 0;
    }
    if (PyList_CheckExact(waiting)) {
        int found = PySequence_Contains(waiting, op);
        return found < 0 ? -1 : found ? 0 : (PyList_Append(waiting, op) < 0 ? -1 : 1);
    }
    PyObject *pair = PyList_New(2);
    if (pair == NULL) {
        return -1;
    }
    PyList_SET_ITEM(pair, 0, Py_NewRef(waiting));
    PyList_SET_ITEM(pair, 1, Py_NewRef(op));
    int err = PyDict_SetItem(at, threshold, pair);
    Py_DECREF(pair);
    return err < 0 ? -1 : 1;
}

/* ThresholdWatchers.add(op, threshold) on a ready `t` (held by the caller): 1 if added, 0 if
 * `op` waited there already, -1 on error (nothing added). */
static int
threshold_add(ThresholdObject *t, PyObject *op, PyObject *threshold)
{
    PyObject *at = threshold_dict(t, threshold == Py_None ? t->plain : t->at);
    if (at == NULL || threshold == Py_None) {
        int err = at == NULL ? -1 : PyDict_SetItem(at, op, Py_None);
        Py_XDECREF(at);
        return err < 0 ? -1 : 1;
    }
    int result = -1;
    PyObject *waiting = PyDict_GetItemWithError(at, threshold);
    Py_XINCREF(waiting);
    if (waiting != NULL) {
        result = waiting_join(at, threshold, waiting, op);
    }
    else if (!PyErr_Occurred() && threshold_queue(t, threshold) == 0) {
        result = PyDict_SetItem(at, threshold, op) < 0 ? -1 : 1;
    }
    Py_XDECREF(waiting);
    Py_DECREF(at);
    return result;
}

/* A released operation: into `plain`, or off the key if it finished through another key. */
static int
release_one(NativeState *st, PyObject *lists, PyObject *plain, PyObject *op)
{
    int state;
    Py_INCREF(op); /* (the plain's insertion runs its __hash__: it may leave `waiting`) */
    int err = entry_state(st, op, &state);
    if (err == 0) {
        err = state & ST_FINISHED ? release_left(st, lists, op)
                                  : PyDict_SetItem(plain, op, Py_None);
    }
    Py_DECREF(op);
    return err;
}

/* The operations that waited at a released `threshold` (taken out of `at`) into `plain`. */
static int
release_at(NativeState *st, ThresholdObject *t, PyObject *lists, PyObject *threshold)
{
    PyObject *at = threshold_dict(t, t->at), *plain = threshold_dict(t, t->plain), *waiting = NULL;
    if (at == NULL || plain == NULL) {
        Py_XDECREF(at);
        Py_XDECREF(plain);
        return -1;
    }
    int found = dict_pop(at, threshold, &waiting);
    int err = found < 0 ? -1 : 0;
    if (found == 0) {
        t->dead--;
    }
    else if (found > 0 && PyList_CheckExact(waiting)) { /* several under one threshold */
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(waiting) && err == 0; i++) {
            err = release_one(st, lists, plain, PyList_GET_ITEM(waiting, i));
        }
    }
    else if (found > 0) {
        err = release_one(st, lists, plain, waiting);
    }
    Py_XDECREF(waiting);
    Py_DECREF(plain);
    Py_DECREF(at);
    return err;
}

/* The smaller of the two heads, if it is <= reached: 1 with *head (a new reference) and
 * *from_heap, 0 when nothing more is released, -1 on error. */
static int
release_head(ThresholdObject *t, PyObject *reached, PyObject **head, int *from_heap)
{
    PyObject *threshold;
    *from_heap = t->run_len == 0;
    if (t->run_len) {
        threshold = Py_NewRef(RUN_AT(t, 0));
        if (t->heap_len) {
            PyObject *top = Py_NewRef(t->heap[0]);
            int lower = compare_values(top, threshold, Py_LT);
            if (lower <= 0) {
                Py_DECREF(top);
                if (lower < 0) {
                    Py_DECREF(threshold);
                    return -1;
                }
            }
            else {
                Py_SETREF(threshold, top);
                *from_heap = 1;
            }
        }
    }
    else if (t->heap_len) {
        threshold = Py_NewRef(t->heap[0]);
    }
    else {
        return 0;
    }
    int reached_it = compare_values(threshold, reached, Py_LE);
    if (reached_it <= 0) {
        Py_DECREF(threshold);
        return reached_it;
    }
    *head = threshold;
    return 1;
}

/* The heap's pop of `threshold` for a release raised (its sift, a threshold's comparison): the
 * head is off the heap already, so its operations are released all the same, or nothing would
 * release them again (a lost wake-up); then the heap is ordered again and the dead entries
 * counted again (`ThresholdWatchers.pop_head`). Always -1, the pop's error raised. */
static int
threshold_pop_failed(NativeState *st, ThresholdObject *t, PyObject *lists, PyObject *threshold)
{
    PyObject *exc = fetch_exception();
    int err = release_at(st, t, lists, threshold);
    if (err == 0) {
        err = marks_heapify(t);
    }
    threshold_recount(t);
    return raise_after(exc, err);
}

/* ThresholdWatchers.pop_head(threshold, lists): the heap's head, `threshold` (held by the
 * caller), popped for a release; if the pop raises, `threshold_pop_failed`. 0 or -1. */
static int
threshold_pop_head(NativeState *st, ThresholdObject *t, PyObject *threshold, PyObject *lists)
{
    PyObject *taken = NULL;
    if (t->heap_len) {
        taken = marks_pop(t);
    }
    else {
        PyErr_SetString(PyExc_IndexError, "index out of range"); /* (heapq's, on an empty list) */
    }
    if (taken == NULL) {
        return threshold_pop_failed(st, t, lists, threshold);
    }
    Py_DECREF(taken);
    return 0;
}

/* ThresholdWatchers.release(reached, lists): every threshold <= reached, in order, its
 * operations into `plain` (finished ones leave: `lists.left`). `t` is held by the caller. */
static int
threshold_release(NativeState *st, ThresholdObject *t, PyObject *reached, PyObject *lists)
{
    for (;;) {
        PyObject *threshold;
        int from_heap;
        int more = release_head(t, reached, &threshold, &from_heap);
        if (more <= 0) {
            return more;
        }
        /* The comparisons may have run the threshold's own code, which may cancel or trigger
         * this key: the head is taken only if it still is the head (the reference's check). */
        int still_head = from_heap ? t->heap_len && t->heap[0] == threshold
                                   : t->run_len && RUN_AT(t, 0) == threshold;
        if (!still_head) {
            Py_DECREF(threshold);
            continue;
        }
        if (!from_heap) {
            Py_DECREF(marks_run_popleft(t)); /* (`threshold` is the same object, still held) */
        }
        else if (threshold_pop_head(st, t, threshold, lists) < 0) {
            Py_DECREF(threshold);
            return -1;
        }
        int err = release_at(st, t, lists, threshold);
        Py_DECREF(threshold);
        if (err < 0) {
            return -1;
        }
    }
}

/* Take `op` out of the list of operations `waiting` at `threshold` in `at` (all held by the
 * caller): 1 if the threshold has nobody left, 0 if others still wait, -1 on error, and *gone
 * whether `op` was there. */
static int
waiting_remove(PyObject *at, PyObject *threshold, PyObject *waiting, PyObject *op, int *gone)
{
    *gone = 0;
    if (waiting == op) {
        *gone = 1;
        return PyDict_DelItem(at, threshold) < 0 ? -1 : 1;
    }
    if (waiting == NULL || !PyList_CheckExact(waiting)) {
        return 0;
    }
    /* `op in waiting`, then `waiting.remove(op)`: the reference's two scans (each may run an
     * operation's __eq__) */
    int found = PySequence_Contains(waiting, op);
    if (found <= 0) {
        return found;
    }
    Py_ssize_t index = PySequence_Index(waiting, op);
    if (index < 0 || PySequence_DelItem(waiting, index) < 0) {
        return -1;
    }
    *gone = 1;
    if (PyList_GET_SIZE(waiting)) {
        return 0;
    }
    return PyDict_DelItem(at, threshold) < 0 ? -1 : 1;
}

static int threshold_compact(ThresholdObject *t);

/* One more dead threshold queued: compacted once they are half of those queued. */
static int
threshold_dead(ThresholdObject *t)
{
    t->dead++;
    if (t->dead > (t->run_len + t->heap_len) >> 1) {
        return threshold_compact(t);
    }
    return 0;
}

/* ThresholdWatchers.pop(op, default, key): 1 if `op` stopped watching, 0 if it did not watch,
 * -1 on error. `t` is held by the caller. */
static int
threshold_pop(NativeState *st, ThresholdObject *t, PyObject *op, PyObject *key)
{
    PyObject *plain = threshold_dict(t, t->plain);
    int found = plain == NULL ? -1 : dict_discard(plain, op);
    Py_XDECREF(plain);
    if (found != 0) {
        return found;
    }
    PyObject *threshold = op_threshold_of(st, op, key);
    if (threshold == NULL || threshold == Py_None) {
        Py_XDECREF(threshold);
        return threshold == NULL ? -1 : 0;
    }
    PyObject *at = threshold_dict(t, t->at);
    if (at == NULL) {
        Py_DECREF(threshold);
        return -1;
    }
    PyObject *waiting = PyDict_GetItemWithError(at, threshold);
    Py_XINCREF(waiting);
    int gone = 0;
    int emptied = waiting == NULL && PyErr_Occurred()
                      ? -1
                      : waiting_remove(at, threshold, waiting, op, &gone);
    Py_XDECREF(waiting);
    Py_DECREF(at);
    Py_DECREF(threshold);
    if (emptied < 0 || (emptied && threshold_dead(t) < 0)) {
        return -1;
    }
    return gone;
}

/* The queued values of the run (ring order) then the heap: a new array of new references. */
static PyObject **
queue_snapshot(ThresholdObject *t, Py_ssize_t *n_run, Py_ssize_t *n_heap)
{
    *n_run = t->run_len;
    *n_heap = t->heap_len;
    PyObject **all = PyMem_New(PyObject *, *n_run + *n_heap + 1);
    if (all == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < *n_run; i++) {
        all[i] = Py_NewRef(RUN_AT(t, i));
    }
    for (Py_ssize_t i = 0; i < *n_heap; i++) {
        all[*n_run + i] = Py_NewRef(t->heap[i]);
    }
    return all;
}

static void
values_release(PyObject **values, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_XDECREF(values[i]);
    }
    PyMem_Free(values);
}

/* Put `run` (a ring from 0, `run_len` of `run_cap` slots) and `heap` in place of the queue; the
 * old values are released once the object is consistent (a release may run a __del__). */
static void
queue_install(ThresholdObject *t, PyObject **run, Py_ssize_t run_len, Py_ssize_t run_cap,
              PyObject **heap, Py_ssize_t heap_len, Py_ssize_t heap_cap)
{
    PyObject **old_run = t->run, **old_heap = t->heap;
    Py_ssize_t head = t->run_head, n_run = t->run_len, cap = t->run_cap, n_heap = t->heap_len;
    t->run = run;
    t->run_head = 0;
    t->run_len = run_len;
    t->run_cap = run_cap;
    t->heap = heap;
    t->heap_len = heap_len;
    t->heap_cap = heap_cap;
    t->run_changes++;
    for (Py_ssize_t i = 0; i < n_run; i++) {
        Py_DECREF(old_run[(head + i) & (cap - 1)]);
    }
    PyMem_Free(old_run);
    values_release(old_heap, n_heap);
}

static void
queue_forget(ThresholdObject *t)
{
    queue_install(t, NULL, 0, 0, NULL, 0, 0);
}

/* Keep the values of `values` (n of them, from `start`) still in `at`, in order, at the front
 * (the others released, their slots NULL): how many, or -1. The lookups run the thresholds'
 * __hash__ / __eq__: `values` holds them all meanwhile. */
static Py_ssize_t
values_alive(PyObject *at, PyObject **values, Py_ssize_t start, Py_ssize_t n)
{
    Py_ssize_t kept = 0;
    for (Py_ssize_t i = start; i < start + n; i++) {
        int alive = PyDict_Contains(at, values[i]);
        if (alive < 0) {
            return -1;
        }
        PyObject *v = values[i];
        values[i] = NULL;
        if (alive) {
            values[start + kept++] = v;
        }
        else {
            Py_DECREF(v);
        }
    }
    return kept;
}

/* A new array of `n` values moved out of `values` (their slots NULL), in `cap` slots. */
static PyObject **
values_move(PyObject **values, Py_ssize_t n, Py_ssize_t cap)
{
    PyObject **moved = PyMem_New(PyObject *, cap);
    if (moved == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    memcpy(moved, values, n * sizeof(PyObject *));
    memset(values, 0, n * sizeof(PyObject *));
    return moved;
}

/* ThresholdWatchers.compact(): the dead thresholds dropped, the run in order, the heap made
 * again. `t` is held by the caller. */
static int
threshold_compact(ThresholdObject *t)
{
    Py_ssize_t n_run, n_heap;
    PyObject **all = queue_snapshot(t, &n_run, &n_heap);
    if (all == NULL) {
        return -1;
    }
    size_t changes = t->run_changes;
    PyObject *at = threshold_dict(t, t->at);
    if (at == NULL) {
        values_release(all, n_run + n_heap);
        return -1;
    }
    Py_ssize_t run = values_alive(at, all, 0, n_run);
    if (run >= 0 && changes != t->run_changes) { /* (as the reference's iteration of a deque) */
        PyErr_SetString(PyExc_RuntimeError, "deque mutated during iteration");
        run = -1;
    }
    Py_ssize_t heap = run < 0 ? -1 : values_alive(at, all, n_run, n_heap);
    Py_DECREF(at);
    Py_ssize_t cap = 8;
    while (heap >= 0 && cap < run) {
        cap <<= 1;
    }
    PyObject **new_run = heap < 0 ? NULL : values_move(all, run, cap);
    PyObject **new_heap = new_run == NULL ? NULL : values_move(all + n_run, heap, heap + 1);
    if (new_heap == NULL) {
        if (new_run != NULL) {
            values_release(new_run, run);
        }
        values_release(all, n_run + n_heap);
        return -1;
    }
    queue_install(t, new_run, run, cap, new_heap, heap, heap + 1);
    values_release(all, n_run + n_heap); /* (every slot moved out or NULL by now) */
    int err = marks_heapify(t);
    Py_ssize_t waiting = t->at != NULL ? PyDict_GET_SIZE(t->at) : 0;
    t->dead = t->run_len + t->heap_len - waiting;
    return err;
}

/* ThresholdWatchers.clear(): every watcher forgotten (a key cancelled or drained). */
static int
threshold_forget(ThresholdObject *t)
{
    PyObject *plain = Py_XNewRef(t->plain), *at = Py_XNewRef(t->at);
    if (plain != NULL) {
        PyDict_Clear(plain);
    }
    if (at != NULL) {
        PyDict_Clear(at);
    }
    Py_XDECREF(plain);
    Py_XDECREF(at);
    queue_forget(t);
    t->dead = 0;
    return 0;
}

/* -- the type's lifecycle ------------------------------------------------------------------- */

/* The hand-written part: the queued thresholds, visited and released (queue_forget). */
static int
threshold_queue_visit(PyObject *self, visitproc visit, void *arg)
{
    ThresholdObject *t = (ThresholdObject *)self;
    for (Py_ssize_t i = 0; i < t->run_len; i++) {
        Py_VISIT(RUN_AT(t, i));
    }
    for (Py_ssize_t i = 0; i < t->heap_len; i++) {
        Py_VISIT(t->heap[i]);
    }
    return 0;
}

static void
threshold_queue_forget(PyObject *self)
{
    queue_forget((ThresholdObject *)self);
}

#define threshold_queue_unready NO_MORE_unready
#define threshold_queue_free NO_MORE_free

TYPE_LIFECYCLE(threshold, ThresholdObject, THRESHOLD_FIELDS, NO_FIELDS, NO_WEAKREFS,
               threshold_queue)

/* __init__(plain): the watchers of a key that held `plain` (a dict) and now gets thresholds. */
static int
threshold_init(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"plain", NULL};
    PyObject *plain;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!:ThresholdWatchers", names, &PyDict_Type,
                                     &plain)) {
        return -1;
    }
    ThresholdObject *t = (ThresholdObject *)self;
    PyObject *at = PyDict_New();
    if (at == NULL) {
        return -1;
    }
    PyObject *old_plain = t->plain, *old_at = t->at, *old_shape = t->shape;
    t->plain = Py_NewRef(plain);
    t->at = at;
    t->shape = Py_NewRef(Py_None);
    t->dead = 0;
    queue_forget(t);
    Py_XDECREF(old_plain); /* (once the object is whole: a release may run code) */
    Py_XDECREF(old_at);
    Py_XDECREF(old_shape);
    return 0;
}

/* -- the methods as Python sees them (the reference's, over the C queue) ---------------------- */

#define THRESHOLD_SELF(self)                                                                     \
    if (!threshold_ready(self)) {                                                                \
        PyErr_SetString(PyExc_TypeError, "ThresholdWatchers: __init__ did not run");             \
        return NULL;                                                                             \
    }                                                                                            \
    ThresholdObject *t = (ThresholdObject *)self;

/* The end of a method: `self` released, `err` (-1) as NULL, else `value`. */
static PyObject *
threshold_done(PyObject *self, int err, PyObject *value)
{
    Py_DECREF(self);
    return err < 0 ? NULL : Py_NewRef(value);
}

static PyObject *
threshold_add_method(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    THRESHOLD_SELF(self)
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "add() takes exactly 2 arguments (%zd given)", nargs);
        return NULL;
    }
    Py_INCREF(self);
    int added = threshold_add(t, args[0], args[1]);
    return threshold_done(self, added, added ? Py_True : Py_False);
}

/* The methods that need the module's state reach it through the class that defines them (PEP 573:
 * METH_METHOD; the type is subclassed, so `Py_TYPE(self)` may be the reference's class). */
#define THRESHOLD_STATE(defining_class) NativeState *st = PyType_GetModuleState(defining_class);

/* The arguments of `method` (`n` of them, each required, by position or by name, as the
 * reference's signature takes them) into `given`: 0, or -1 with the TypeError a Python function
 * raises for a missing, repeated or unknown one. */
static int
threshold_args(const char *method, const char *const *names, int n, PyObject *const *args,
               Py_ssize_t nargs, PyObject *kwnames, PyObject **given)
{
    if (nargs > n) {
        PyErr_Format(PyExc_TypeError, "%s() takes at most %d arguments (%zd given)", method, n,
                     nargs);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        given[i] = i < nargs ? args[i] : NULL;
    }
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, k);
        int at = -1;
        for (int i = 0; i < n && at < 0; i++) {
            if (PyUnicode_CompareWithASCIIString(name, names[i]) == 0) {
                at = i;
            }
        }
        if (at < 0 || given[at] != NULL) {
            PyErr_Format(PyExc_TypeError,
                         at < 0 ? "%s() got an unexpected keyword argument '%U'"
                                : "%s() got multiple values for argument '%U'",
                         method, name);
            return -1;
        }
        given[at] = args[nargs + k];
    }
    for (int i = 0; i < n; i++) {
        if (given[i] == NULL) {
            PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s' (pos %d)", method,
                         names[i], i + 1);
            return -1;
        }
    }
    return 0;
}

/* release(reached, lists), each by position or by name. */
static PyObject *
threshold_release_method(PyObject *self, PyTypeObject *defining_class, PyObject *const *args,
                         Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"reached", "lists"};
    PyObject *given[2];
    THRESHOLD_SELF(self)
    THRESHOLD_STATE(defining_class)
    if (threshold_args("release", names, 2, args, nargs, kwnames, given) < 0) {
        return NULL;
    }
    Py_INCREF(self);
    return threshold_done(self, threshold_release(st, t, given[0], given[1]), Py_None);
}

/* pop_head(threshold, lists), each by position or by name. */
static PyObject *
threshold_pop_head_method(PyObject *self, PyTypeObject *defining_class, PyObject *const *args,
                          Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"threshold", "lists"};
    PyObject *given[2];
    THRESHOLD_SELF(self)
    THRESHOLD_STATE(defining_class)
    if (threshold_args("pop_head", names, 2, args, nargs, kwnames, given) < 0) {
        return NULL;
    }
    Py_INCREF(self);
    return threshold_done(self, threshold_pop_head(st, t, given[0], given[1]), Py_None);
}

static PyObject *
threshold_recount_method(PyObject *self, PyObject *unused)
{
    THRESHOLD_SELF(self)
    threshold_recount(t);
    Py_RETURN_NONE;
}

static PyObject *
threshold_push_method(PyObject *self, PyObject *threshold)
{
    Py_INCREF(self);
    return threshold_done(self, threshold_push((ThresholdObject *)self, threshold), Py_None);
}

static PyObject *
threshold_unpush_method(PyObject *self, PyObject *threshold)
{
    Py_INCREF(self);
    return threshold_done(self, marks_unpush((ThresholdObject *)self, threshold), Py_None);
}

/* pop(op, default, key), each by position or by name. */
static PyObject *
threshold_pop_method(PyObject *self, PyTypeObject *defining_class, PyObject *const *args,
                     Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"op", "default", "key"};
    PyObject *given[3];
    THRESHOLD_SELF(self)
    THRESHOLD_STATE(defining_class)
    if (threshold_args("pop", names, 3, args, nargs, kwnames, given) < 0) {
        return NULL;
    }
    PyObject *op = given[0], *dflt = given[1], *key = given[2];
    Py_INCREF(self);
    int gone = threshold_pop(st, t, op, key);
    return threshold_done(self, gone, gone ? Py_None : dflt);
}

static PyObject *
threshold_clear_method(PyObject *self, PyObject *unused)
{
    THRESHOLD_SELF(self)
    Py_INCREF(self);
    return threshold_done(self, threshold_forget(t), Py_None);
}

static PyObject *
threshold_compact_method(PyObject *self, PyObject *unused)
{
    THRESHOLD_SELF(self)
    Py_INCREF(self);
    return threshold_done(self, threshold_compact(t), Py_None);
}

static PyMethodDef threshold_methods[] = {
    {"add", (PyCFunction)(void (*)(void))threshold_add_method, METH_FASTCALL,
     "add(op, threshold)\n--\n\nWatch at `threshold` (None: plain): False if `op` already "
     "waited there."},
    {"release", (PyCFunction)(void (*)(void))threshold_release_method,
     METH_METHOD | METH_FASTCALL | METH_KEYWORDS,
     "release(reached, lists)\n--\n\nRelease every threshold <= reached, in order."},
    {"pop_head", (PyCFunction)(void (*)(void))threshold_pop_head_method,
     METH_METHOD | METH_FASTCALL | METH_KEYWORDS,
     "pop_head(threshold, lists)\n--\n\nPop `threshold`, the heap's head, for a release (its "
     "operations released even if the pop's sift raises)."},
    {"recount", threshold_recount_method, METH_NOARGS,
     "recount()\n--\n\nCount the dead entries again from the queue and `at`."},
    {"push", threshold_push_method, METH_O,
     "push(threshold)\n--\n\nQueue an out-of-order `threshold` in the heap."},
    {"unpush", threshold_unpush_method, METH_O,
     "unpush(threshold)\n--\n\nUndo a push of `threshold` that raised."},
    {"pop", (PyCFunction)(void (*)(void))threshold_pop_method,
     METH_METHOD | METH_FASTCALL | METH_KEYWORDS,
     "pop(op, default, key)\n--\n\nStop watching `op`: None, or `default` if it did not watch."},
    {"clear", threshold_clear_method, METH_NOARGS,
     "clear()\n--\n\nForget every watcher (a key cancelled or drained)."},
    {"compact", threshold_compact_method, METH_NOARGS,
     "compact()\n--\n\nDrop the dead entries: the run keeps its order; the heap is made again."},
    {NULL},
};

/* `run` and `heap` as the reference's containers (copies: the queue is the C object's). */
static PyObject *
threshold_get_run(PyObject *self, void *closure)
{
    ThresholdObject *t = (ThresholdObject *)self;
    PyObject *items = PyList_New(t->run_len);
    if (items == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items) && i < t->run_len; i++) {
        PyList_SET_ITEM(items, i, Py_NewRef(RUN_AT(t, i)));
    }
    PyObject *run = NULL;
    PyObject *collections = items == NULL ? NULL : PyImport_ImportModule("collections");
    if (collections != NULL) { /* (a copy for the reference's code and tests: cold) */
        run = PyObject_CallMethod(collections, "deque", "O", items);
        Py_DECREF(collections);
    }
    Py_XDECREF(items);
    return run;
}

static PyObject *
threshold_get_heap(PyObject *self, void *closure)
{
    ThresholdObject *t = (ThresholdObject *)self;
    PyObject *heap = PyList_New(t->heap_len);
    for (Py_ssize_t i = 0; heap != NULL && i < PyList_GET_SIZE(heap) && i < t->heap_len; i++) {
        PyList_SET_ITEM(heap, i, Py_NewRef(t->heap[i]));
    }
    return heap;
}

/* `plain` and `at` (read-only: the C reads them as dicts). */
static PyObject *
threshold_get_dict(PyObject *self, void *closure)
{
    PyObject *dict = *(PyObject **)((char *)self + (Py_ssize_t)closure);
    if (dict == NULL) {
        PyErr_SetString(PyExc_AttributeError, "ThresholdWatchers: __init__ did not run");
        return NULL;
    }
    return Py_NewRef(dict);
}

static PyGetSetDef threshold_getset[] = {
    FIELD(ThresholdObject, shape, "shape"),
    {"plain", threshold_get_dict, NULL, "The plain watchers (an ordered set).",
     (void *)offsetof(ThresholdObject, plain)},
    {"at", threshold_get_dict, NULL, "Each waiting threshold's operation (or list of them).",
     (void *)offsetof(ThresholdObject, at)},
    {"run", threshold_get_run, NULL, "The run (a copy): thresholds queued in order.", NULL},
    {"heap", threshold_get_heap, NULL, "The heap (a copy), in heapq's layout.", NULL},
    {NULL},
};

static PyMemberDef threshold_members[] = {
    {"dead", Py_T_PYSSIZET, offsetof(ThresholdObject, dead), 0, NULL},
    {NULL},
};
