/* The timing wheel's hot methods (purgatory/_wheel.py: add, remove, advance and its cascades,
 * next_deadline, and _push, _add_level, _advance_clock, which own the data below) over a C
 * layout: buckets are intrusive lists through their entries, by identity (Kafka's
 * TimerTaskList: an operation carries its link, any other entry gets one while it is held), with
 * the reference's four fields, so that adding, removing and advancing call no Python code for
 * an operation (the reference's bucket, a dict keyed by id(entry), calls none either); the queue of
 * buckets by due tick is a C array kept as heapq keeps the reference's list of (due tick,
 * -level, push count, bucket) tuples, in the same order; each level's current tick, span and
 * lead are C integers. `_heap`, `_current`, `_spans` and `_leads` are computed for Python (the
 * reference's invariant check and gauge read them), and assigning one (the reference's
 * __init__) sets the C data. The cold methods (construction, iteration, the invariant check)
 * stay the reference's; advance and next_deadline never hand a set-up wheel to the
 * reference, whose heapq calls would work on a copy.
 *
 * Entries are usually operations (their fields are read directly); anything else with the
 * `_bucket` and `_deadline` attributes of the TimerEntry protocol works through attributes.
 */

#define TICK_INF LLONG_MAX

static inline long long
floordiv(long long a, long long b)
{
    long long q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) {
        q--;
    }
    return q;
}

static inline long long
floormod(long long a, long long b)
{
    long long r = a % b;
    if (r != 0 && ((r < 0) != (b < 0))) {
        r += b;
    }
    return r;
}

/* A Python int that fits a long long, or -1 with OverflowError/TypeError set. */
static inline int
as_tick(PyObject *o, long long *out)
{
    *out = PyLong_AsLongLong(o);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static inline PyObject *
tick_or_inf(long long tick)
{
    return tick == TICK_INF ? PyFloat_FromDouble(INFINITY) : PyLong_FromLongLong(tick);
}

/* -- the Bucket type: an intrusive list of entries, with four fields ------------------------------ */

/* The list's links. A bucket is Kafka's TimerTaskList: a circular doubly linked list through its
 * entries' links, around the bucket's `head`, with its size. Nothing here runs Python code: an
 * entry is linked and unlinked by its address (its identity), never by its hash. */

static inline TimerLink *
bucket_first(BucketObject *b)
{
    return b->head.next == NULL || b->head.next == &b->head ? NULL : b->head.next;
}

/* `l` (not linked) as the newest entry of `b`, which takes `entry`, a new reference. */
static inline void
link_append(BucketObject *b, TimerLink *l, PyObject *entry)
{
    if (b->head.next == NULL) {
        b->head.next = b->head.prev = &b->head;
    }
    l->entry = entry;
    l->list = (PyObject *)b;
    l->prev = b->head.prev;
    l->next = &b->head;
    b->head.prev->next = l;
    b->head.prev = l;
    b->size++;
}

/* `l` out of `b`, which links it; the bucket's reference to its entry is returned, for the
 * caller to release once its own state is settled (a release may run code). A link made for an
 * entry that is not an operation is freed here (the caller drops its `others` record first). */
static inline PyObject *
link_cut(BucketObject *b, TimerLink *l)
{
    PyObject *entry = l->entry;
    l->prev->next = l->next;
    l->next->prev = l->prev;
    l->prev = l->next = NULL;
    l->list = NULL;
    l->entry = NULL;
    b->size--;
    if (l->heap) {
        PyMem_Free(l);
    }
    return entry;
}

/* The `others` record of `l`, a link made for an entry that is not an operation, dropped
 * before the link is cut (its key is the entry's id). No code runs: the keys are ints. */
static int
link_forget(BucketObject *b, TimerLink *l)
{
    if (!l->heap || b->others == NULL) {
        return 0;
    }
    PyObject *key = PyLong_FromVoidPtr(l->entry);
    int err = key == NULL ? -1 : PyDict_DelItem(b->others, key);
    Py_XDECREF(key);
    return err;
}

/* Every entry out of `b`, released once all are out (as a dict's clear: a release may run
 * code, which finds the bucket empty, and what it adds stays). The links are all undone before
 * the first release, so code that links an operation elsewhere meanwhile touches nothing this
 * walks. Runs from tp_clear and tp_dealloc too, so it keeps whatever exception is set. */
static void
bucket_drop_all(BucketObject *b)
{
    Py_ssize_t n = b->size;
    if (n == 0) {
        Py_CLEAR(b->others); /* (ints only: its release runs nothing) */
        return;
    }
    PyObject *exc = PyErr_Occurred() ? fetch_exception() : NULL;
    PyObject **entries = PyMem_Malloc((size_t)n * sizeof(PyObject *));
    Py_ssize_t taken = 0;
    TimerLink *l;
    while (entries != NULL && (l = bucket_first(b)) != NULL) { /* (no code runs here) */
        entries[taken++] = link_cut(b, l);
    }
    PyObject *others = b->others;
    b->others = NULL;
    Py_XDECREF(others); /* (ints only) */
    while ((l = bucket_first(b)) != NULL) { /* (no memory for the array: one at a time) */
        Py_DECREF(link_cut(b, l));
    }
    for (Py_ssize_t i = 0; i < taken; i++) {
        Py_DECREF(entries[i]);
    }
    PyMem_Free(entries);
    if (exc != NULL) {
        restore_exception(exc);
    }
}

/* The bucket's lifecycle: its fields' table is BUCKET_FIELDS (native.h); the hand-written part
 * is its entries, a walk of its list (visited; dropped last by tp_clear, bucket_drop_all). */
static int
bucket_entries_visit(PyObject *self, visitproc visit, void *arg)
{
    BucketObject *b = (BucketObject *)self;
    for (TimerLink *l = bucket_first(b); l != NULL && l != &b->head; l = l->next) {
        Py_VISIT(l->entry);
    }
    return 0;
}

static void
bucket_entries_forget(PyObject *self)
{
    bucket_drop_all((BucketObject *)self);
}

#define bucket_entries_unready NO_MORE_unready
#define bucket_entries_free NO_MORE_free

TYPE_LIFECYCLE(bucket, BucketObject, BUCKET_FIELDS, NO_FIELDS, NO_WEAKREFS, bucket_entries)

static PyMemberDef bucket_members[] = {
    {"expiration", Py_T_LONGLONG, offsetof(BucketObject, expiration), 0, NULL},
    {"level", Py_T_INT, offsetof(BucketObject, level), 0, NULL},
    {"older", MEMBER_OBJECT_OR_NONE, offsetof(BucketObject, older), 0, NULL},
    {"wheel", Py_T_OBJECT_EX, offsetof(BucketObject, wheel), 0, NULL},
    {NULL},
};

static inline Py_ssize_t
bucket_size(PyObject *b)
{
    return ((BucketObject *)b)->size;
}

static Py_ssize_t
bucket_length(PyObject *self)
{
    return bucket_size(self);
}

/* A bucket's older part (None, NULL or a bucket: Python code may assign anything) holds
 * something. */
static inline int
part_used(NativeState *st, PyObject *part)
{
    return part != NULL && part != Py_None && Bucket_Check(part) && bucket_size(part) > 0;
}

static inline int
bucket_in_use(NativeState *st, PyObject *b)
{
    return bucket_size(b) > 0 || part_used(st, ((BucketObject *)b)->older);
}

/* The entries of `b`, oldest first, appended to `list` (appending runs no code). */
static int
bucket_extend(BucketObject *b, PyObject *list)
{
    for (TimerLink *l = bucket_first(b); l != NULL && l != &b->head; l = l->next) {
        if (PyList_Append(list, l->entry) < 0) {
            return -1;
        }
    }
    return 0;
}

/* A new list of the entries of `b`, oldest first. */
static PyObject *
bucket_entries(BucketObject *b)
{
    PyObject *list = PyList_New(0); /* (may collect: the bucket is walked after it) */
    if (list != NULL && bucket_extend(b, list) < 0) {
        Py_CLEAR(list);
    }
    return list;
}

/* Every entry of `b` moved to the end of `due`, oldest first. */
static int
bucket_take_all(BucketObject *b, PyObject *due)
{
    TimerLink *l;
    while ((l = bucket_first(b)) != NULL) {
        if (PyList_Append(due, l->entry) < 0 || link_forget(b, l) < 0) {
            return -1;
        }
        Py_DECREF(link_cut(b, l)); /* (`due` holds it: nothing is released) */
    }
    return 0;
}

static PyObject *
already_held(PyObject *entry)
{
    PyErr_Format(PyExc_RuntimeError, "%R is held by another bucket (remove it first)", entry);
    return NULL;
}

/* An entry that is not an operation: a link of its own, recorded under its id in the bucket's
 * `others`. The dict is made first (an allocation may collect and so run code), and what the
 * bucket holds is read after it. */
static int
bucket_take_other(BucketObject *b, PyObject *entry)
{
    if (b->others == NULL) {
        PyObject *others = PyDict_New();
        if (others == NULL) {
            return -1;
        }
        if (b->others == NULL) {
            b->others = others;
        }
        else {
            Py_DECREF(others);
        }
    }
    PyObject *key = PyLong_FromVoidPtr(entry);
    if (key == NULL) {
        return -1;
    }
    int held = PyDict_Contains(b->others, key); /* (int keys: no code runs) */
    if (held != 0) {
        Py_DECREF(key);
        return held < 0 ? -1 : 0; /* held already: it keeps its place, as a dict's key does */
    }
    TimerLink *l = PyMem_Calloc(1, sizeof(TimerLink));
    PyObject *address = l == NULL ? NULL : PyLong_FromVoidPtr(l);
    if (address == NULL || PyDict_SetItem(b->others, key, address) < 0) {
        PyMem_Free(l);
        Py_XDECREF(address);
        Py_DECREF(key);
        return l == NULL ? (PyErr_NoMemory(), -1) : -1;
    }
    Py_DECREF(address);
    Py_DECREF(key);
    l->heap = 1;
    link_append(b, l, Py_NewRef(entry));
    return 0;
}

/* `b[id(entry)] = entry`: `entry` as the newest of `b` (held already: it keeps its place). */
static inline int
bucket_take(NativeState *st, BucketObject *b, PyObject *entry)
{
    if (Op_Check(entry)) {
        TimerLink *l = &((OpObject *)entry)->link;
        if (l->list != NULL) {
            return l->list == (PyObject *)b ? 0 : (already_held(entry), -1);
        }
        link_append(b, l, Py_NewRef(entry));
        return 0;
    }
    return bucket_take_other(b, entry);
}

/* `entry` out of `b`: 1 with the bucket's reference in *held (released by the caller once its
 * state is settled), 0 if `b` does not hold it, -1 on error. */
static int
bucket_cut(NativeState *st, BucketObject *b, PyObject *entry, PyObject **held)
{
    if (Op_Check(entry)) {
        TimerLink *l = &((OpObject *)entry)->link;
        if (l->list != (PyObject *)b) {
            return 0;
        }
        *held = link_cut(b, l);
        return 1;
    }
    if (b->others == NULL) {
        return 0;
    }
    PyObject *key = PyLong_FromVoidPtr(entry);
    if (key == NULL) {
        return -1;
    }
    PyObject *address = PyDict_GetItemWithError(b->others, key); /* (borrowed, ints only) */
    if (address == NULL) {
        Py_DECREF(key);
        return PyErr_Occurred() ? -1 : 0;
    }
    TimerLink *l = PyLong_AsVoidPtr(address);
    int err = PyDict_DelItem(b->others, key);
    Py_DECREF(key);
    if (err < 0) {
        return -1;
    }
    *held = link_cut(b, l);
    return 1;
}

static int
not_in_bucket(PyObject *entry)
{
    PyObject *key = PyLong_FromVoidPtr(entry);
    if (key != NULL) {
        PyErr_SetObject(PyExc_KeyError, key); /* (the reference's: `del self[id(entry)]`) */
        Py_DECREF(key);
    }
    return -1;
}

/* -- entries ------------------------------------------------------------------------------------ */

static inline int
entry_set_bucket(NativeState *st, PyObject *entry, PyObject *bucket)
{
    if (Op_Check(entry)) {
        set_field(&((OpObject *)entry)->bucket, bucket);
        return 0;
    }
    return PyObject_SetAttrString(entry, "_bucket", bucket);
}

static inline int
entry_set_deadline(NativeState *st, PyObject *entry, long long deadline)
{
    if (Op_Check(entry)) {
        ((OpObject *)entry)->deadline = deadline;
        OP_SET(entry) |= SET_DEADLINE;
        return 0;
    }
    PyObject *d = PyLong_FromLongLong(deadline);
    if (d == NULL) {
        return -1;
    }
    int err = PyObject_SetAttrString(entry, "_deadline", d);
    Py_DECREF(d);
    return err;
}

/* The entry's bucket (a new reference, None included), or NULL on error. */
static inline PyObject *
entry_bucket(NativeState *st, PyObject *entry)
{
    if (Op_Check(entry)) {
        PyObject *b = ((OpObject *)entry)->bucket;
        if (b == NULL) {
            return unset_error(entry, "_bucket");
        }
        return Py_NewRef(b);
    }
    return PyObject_GetAttrString(entry, "_bucket");
}

static inline int
entry_deadline(NativeState *st, PyObject *entry, long long *out)
{
    if (Op_Check(entry)) {
        if (!(OP_SET(entry) & SET_DEADLINE)) {
            unset_error(entry, "_deadline");
            return -1;
        }
        *out = ((OpObject *)entry)->deadline;
        return 0;
    }
    PyObject *d = PyObject_GetAttrString(entry, "_deadline");
    if (d == NULL) {
        return -1;
    }
    int err = as_tick(d, out);
    Py_DECREF(d);
    return err;
}

/* -- the bucket protocol: `bucket.remove(entry)`, `bucket[id(entry)] = entry`, iteration -------- */

/* `bucket.remove(entry)`, the protocol's removal (Kafka's TimerTaskList.remove): `entry` out of
 * `bucket` and its `_bucket` set to None; a bucket that is not the module's has its own method
 * called. 0, or -1 with KeyError if the bucket does not hold it. */
static int
bucket_remove(NativeState *st, PyObject *bucket, PyObject *entry)
{
    if (!Bucket_Check(bucket)) {
        return discard_result(call_method1(bucket, N.s_remove, entry));
    }
    PyObject *held;
    int found = bucket_cut(st, (BucketObject *)bucket, entry, &held);
    if (found <= 0) {
        return found < 0 ? -1 : not_in_bucket(entry);
    }
    Py_INCREF(bucket); /* (the entry's own reference to it goes below) */
    int err = entry_set_bucket(st, entry, Py_None);
    Py_DECREF(bucket);
    Py_DECREF(held);
    return err;
}

/* The slots and methods below run outside a C body: they find the module's state by type. */

static PyObject *
bucket_remove_method(PyObject *self, PyObject *entry)
{
    NativeState *st = state_of_type(Py_TYPE(self));
    if (st == NULL) {
        return NULL;
    }
    Py_INCREF(self);
    int err = bucket_remove(st, self, entry);
    Py_DECREF(self);
    if (err < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
bucket_values(PyObject *self, PyObject *unused)
{
    return bucket_entries((BucketObject *)self);
}

static PyObject *
bucket_clear_method(PyObject *self, PyObject *unused)
{
    Py_INCREF(self);
    bucket_drop_all((BucketObject *)self);
    Py_DECREF(self);
    Py_RETURN_NONE;
}

static PyObject *
bucket_iter(PyObject *self)
{
    PyObject *entries = bucket_entries((BucketObject *)self);
    if (entries == NULL) {
        return NULL;
    }
    PyObject *it = PyObject_GetIter(entries);
    Py_DECREF(entries);
    return it;
}

/* `id(entry) in bucket`, as the reference's dict answers it: by address, never by comparing
 * entries (O(size): the protocol never asks, an invariant check may). */
static int
bucket_contains(PyObject *self, PyObject *key)
{
    if (!PyLong_Check(key)) {
        return 0;
    }
    void *address = PyLong_AsVoidPtr(key);
    if (address == NULL && PyErr_Occurred()) {
        PyErr_Clear(); /* (an int no address is: not there) */
        return 0;
    }
    BucketObject *b = (BucketObject *)self;
    for (TimerLink *l = bucket_first(b); l != NULL && l != &b->head; l = l->next) {
        if ((void *)l->entry == address) {
            return 1;
        }
    }
    return 0;
}

/* `bucket[id(entry)] = entry` (the protocol's add, as the reference's dict is keyed); entries
 * leave by `remove(entry)`. */
static int
bucket_ass_subscript(PyObject *self, PyObject *key, PyObject *value)
{
    if (value == NULL) {
        PyErr_SetString(PyExc_TypeError, "a bucket's entries leave by bucket.remove(entry)");
        return -1;
    }
    if (!PyLong_Check(key) || PyLong_AsVoidPtr(key) != (void *)value) {
        if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError,
                         "a bucket holds an entry under its id (bucket[id(entry)] = entry), "
                         "got the key %R",
                         key);
        }
        return -1;
    }
    NativeState *st = state_of_type(Py_TYPE(self));
    if (st == NULL) {
        return -1;
    }
    Py_INCREF(self);
    int err = bucket_take(st, (BucketObject *)self, value);
    Py_DECREF(self);
    return err;
}

static PyMethodDef bucket_methods[] = {
    {"remove", bucket_remove_method, METH_O,
     "Take the entry out (by identity) and set its _bucket to None; KeyError if not held."},
    {"values", bucket_values, METH_NOARGS, "The entries, oldest first (a new list)."},
    {"clear", bucket_clear_method, METH_NOARGS, "Drop every entry (their _bucket untouched)."},
    {NULL},
};

/* -- the wheel's fields ------------------------------------------------------------------------ */

/* The wheel's lifecycle: its fields' table is WHEEL_FIELDS (native.h); the hand-written part is
 * its queue of buckets (a C array of references) and its tick arrays (C memory, freed by the
 * dealloc only: a cleared wheel still reads them). */
static int
wheel_queue_visit(PyObject *self, visitproc visit, void *arg)
{
    WheelObject *w = (WheelObject *)self;
    for (Py_ssize_t i = 0; i < w->heap_len; i++) {
        Py_VISIT(w->heap[i].bucket);
    }
    return 0;
}

/* Empty the queue; its buckets are released once it is (their release may run code). */
static void
wheel_clear_heap(WheelObject *w)
{
    WheelItem *heap = w->heap;
    Py_ssize_t len = w->heap_len;
    w->heap = NULL;
    w->heap_len = w->heap_cap = 0;
    w->ready = 0;
    for (Py_ssize_t i = 0; i < len; i++) {
        Py_DECREF(heap[i].bucket);
    }
    PyMem_Free(heap);
}

/* Before tp_clear releases anything (a release may run code that reaches the wheel). */
static void
wheel_queue_unready(PyObject *self)
{
    ((WheelObject *)self)->ready = 0;
}

static void
wheel_queue_forget(PyObject *self)
{
    WheelObject *w = (WheelObject *)self;
    w->heap_set = 0;
    wheel_clear_heap(w); /* (ready reset again: a release above may have checked it) */
}

static void
wheel_queue_free(PyObject *self)
{
    WheelObject *w = (WheelObject *)self;
    PyMem_Free(w->current.v);
    PyMem_Free(w->spans.v);
    PyMem_Free(w->leads.v);
}

TYPE_LIFECYCLE(wheel, WheelObject, WHEEL_FIELDS, NO_FIELDS, NO_WEAKREFS, wheel_queue)

/* -- ticks per level (`_current`, `_spans`, `_leads`) as C integers ------------------------------ */

static int
ticks_reserve(TickArray *a, Py_ssize_t n)
{
    if (a->v != NULL && n <= a->cap) {
        return 0;
    }
    Py_ssize_t cap = a->cap < 4 ? 4 : a->cap;
    while (cap < n) {
        cap *= 2;
    }
    long long *v = PyMem_Realloc(a->v, (size_t)cap * sizeof(long long));
    if (v == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    a->v = v;
    a->cap = cap;
    return 0;
}

static int
ticks_append(TickArray *a, long long value)
{
    if (ticks_reserve(a, a->n + 1) < 0) {
        return -1;
    }
    a->v[a->n++] = value;
    return 0;
}

typedef struct {
    Py_ssize_t offset;
    const char *name;
} TicksSpec;

#define TICKS_AT(o, spec) ((TickArray *)((char *)(o) + (spec)->offset))

static PyObject *
ticks_get(PyObject *self, void *closure)
{
    const TicksSpec *spec = closure;
    TickArray *a = TICKS_AT(self, spec);
    if (a->v == NULL) {
        PyErr_Format(PyExc_AttributeError, "'%.200s' object has no attribute '%s'",
                     Py_TYPE(self)->tp_name, spec->name);
        return NULL;
    }
    Py_ssize_t n = a->n;
    PyObject *list = PyList_New(n); /* (a collection here may run code: the array is re-read) */
    if (list == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = (a->v != NULL && i < a->n) ? PyLong_FromLongLong(a->v[i]) : Py_NewRef(Py_None);
        if (v == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, v);
    }
    return list;
}

/* A list of ints each fitting a C long long (the ticks a timer counts stay below 2**63). */
static int
ticks_set(PyObject *self, PyObject *value, void *closure)
{
    const TicksSpec *spec = closure;
    if (value == NULL || !PyList_Check(value)) {
        PyErr_Format(PyExc_TypeError, "%s must be a list of ints", spec->name);
        return -1;
    }
    Py_ssize_t n = PyList_GET_SIZE(value);
    long long *v = PyMem_Malloc((size_t)(n > 4 ? n : 4) * sizeof(long long));
    if (v == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) { /* (nothing here runs code: the list stays as it is) */
        PyObject *item = PyList_GET_ITEM(value, i);
        if (!PyLong_Check(item)) {
            PyMem_Free(v);
            PyErr_Format(PyExc_TypeError, "%s must be a list of ints, got %R", spec->name, item);
            return -1;
        }
        v[i] = PyLong_AsLongLong(item);
        if (v[i] == -1 && PyErr_Occurred()) {
            PyMem_Free(v);
            return -1;
        }
    }
    TickArray *a = TICKS_AT(self, spec);
    PyMem_Free(a->v);
    a->v = v;
    a->n = n;
    a->cap = n > 4 ? n : 4;
    ((WheelObject *)self)->ready = 0;
    return 0;
}

#define TICKS(member, pyname)                                                                   \
    {pyname, ticks_get, ticks_set, NULL,                                                        \
     (void *)&(const TicksSpec){offsetof(WheelObject, member), pyname}}

/* -- the queue of buckets by due tick: heapq's algorithm over a C array ------------------------ */

static inline int
item_less(const WheelItem *a, const WheelItem *b)
{
    if (a->tick != b->tick) {
        return a->tick < b->tick;
    }
    if (a->neg_level != b->neg_level) {
        return a->neg_level < b->neg_level;
    }
    return a->count < b->count;
}

/* heapq._siftdown */
static void
heap_siftdown(WheelItem *heap, Py_ssize_t start, Py_ssize_t pos)
{
    WheelItem item = heap[pos];
    while (pos > start) {
        Py_ssize_t parent = (pos - 1) >> 1;
        if (!item_less(&item, &heap[parent])) {
            break;
        }
        heap[pos] = heap[parent];
        pos = parent;
    }
    heap[pos] = item;
}

/* heapq._siftup */
static void
heap_siftup(WheelItem *heap, Py_ssize_t len, Py_ssize_t pos)
{
    Py_ssize_t start = pos;
    WheelItem item = heap[pos];
    Py_ssize_t child = 2 * pos + 1;
    while (child < len) {
        Py_ssize_t right = child + 1;
        if (right < len && !item_less(&heap[child], &heap[right])) {
            child = right;
        }
        heap[pos] = heap[child];
        pos = child;
        child = 2 * pos + 1;
    }
    heap[pos] = item;
    heap_siftdown(heap, start, pos);
}

static int
heap_push_item(WheelObject *w, WheelItem item)
{
    if (w->heap_len == w->heap_cap) {
        Py_ssize_t cap = w->heap_cap < 16 ? 16 : 2 * w->heap_cap;
        WheelItem *heap = PyMem_Realloc(w->heap, (size_t)cap * sizeof(WheelItem));
        if (heap == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        w->heap = heap;
        w->heap_cap = cap;
    }
    Py_INCREF(item.bucket);
    w->heap[w->heap_len++] = item;
    heap_siftdown(w->heap, 0, w->heap_len - 1);
    return 0;
}

/* heapq.heappop: the first item's bucket, a reference the caller releases (not before its
 * state is settled: a release may run code). The queue must not be empty. */
static PyObject *
heap_pop(WheelObject *w)
{
    WheelItem last = w->heap[--w->heap_len];
    if (w->heap_len == 0) {
        return last.bucket;
    }
    PyObject *top = w->heap[0].bucket;
    w->heap[0] = last;
    heap_siftup(w->heap, w->heap_len, 0);
    return top;
}

/* The queue as the reference's list of (due tick, -level, push count, bucket), in its order. */
static PyObject *
heap_get(PyObject *self, void *closure)
{
    WheelObject *w = (WheelObject *)self;
    if (!w->heap_set) {
        PyErr_Format(PyExc_AttributeError, "'%.200s' object has no attribute '_heap'",
                     Py_TYPE(self)->tp_name);
        return NULL;
    }
    PyObject *list = PyList_New(0);
    for (Py_ssize_t i = 0; list != NULL && i < w->heap_len; i++) {
        WheelItem item = w->heap[i]; /* (a copy: a collection below may run code) */
        Py_INCREF(item.bucket);
        PyObject *t = Py_BuildValue("(LiLN)", item.tick, item.neg_level, item.count, item.bucket);
        if (t == NULL || PyList_Append(list, t) < 0) {
            Py_XDECREF(t);
            Py_CLEAR(list);
            break;
        }
        Py_DECREF(t);
    }
    return list;
}

/* One of `_heap`'s tuples (tick, -level, count, bucket) into `item` (its bucket borrowed);
 * nothing here runs code. 0, or -1 with a TypeError (or an overflow's error). */
static int
heap_item_parse(NativeState *st, PyObject *t, WheelItem *item)
{
    long long level = 0;
    if (!PyTuple_CheckExact(t) || PyTuple_GET_SIZE(t) != 4 ||
        !PyLong_Check(PyTuple_GET_ITEM(t, 0)) || !PyLong_Check(PyTuple_GET_ITEM(t, 1)) ||
        !PyLong_Check(PyTuple_GET_ITEM(t, 2)) || !Bucket_Check(PyTuple_GET_ITEM(t, 3)) ||
        as_tick(PyTuple_GET_ITEM(t, 0), &item->tick) < 0 ||
        as_tick(PyTuple_GET_ITEM(t, 1), &level) < 0 ||
        as_tick(PyTuple_GET_ITEM(t, 2), &item->count) < 0 || level < INT_MIN || level > 0) {
        if (!PyErr_Occurred()) {
            PyErr_Format(PyExc_TypeError,
                         "_heap must hold (tick, -level, count, bucket) tuples, got %R", t);
        }
        return -1;
    }
    item->neg_level = (int)level;
    item->bucket = PyTuple_GET_ITEM(t, 3);
    return 0;
}

/* A list of such tuples (the reference's __init__ assigns an empty one), taken as a heap. */
static int
heap_set(PyObject *self, PyObject *value, void *closure)
{
    WheelObject *w = (WheelObject *)self;
    NativeState *st = state_of_type(Py_TYPE(self)); /* (for Bucket_Check) */
    if (st == NULL) {
        return -1;
    }
    if (value == NULL || !PyList_Check(value)) {
        PyErr_SetString(PyExc_TypeError, "_heap must be a list");
        return -1;
    }
    Py_ssize_t n = PyList_GET_SIZE(value);
    WheelItem *heap = PyMem_Malloc((size_t)(n > 16 ? n : 16) * sizeof(WheelItem));
    if (heap == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) { /* (nothing here runs code: the list stays as it is) */
        if (heap_item_parse(st, PyList_GET_ITEM(value, i), &heap[i]) < 0) {
            PyMem_Free(heap);
            return -1;
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_INCREF(heap[i].bucket);
    }
    WheelItem *old = w->heap; /* (replaced first: releasing its buckets may run code) */
    Py_ssize_t old_len = w->heap_len;
    w->heap = heap;
    w->heap_len = n;
    w->heap_cap = n > 16 ? n : 16;
    w->heap_set = 1;
    w->ready = 0;
    for (Py_ssize_t i = 0; i < old_len; i++) {
        Py_DECREF(old[i].bucket);
    }
    PyMem_Free(old);
    return 0;
}

static PyGetSetDef wheel_getset[] = {
    FIELD_OR_NONE(WheelObject, active, "_active"),
    TICKS(current, "_current"),
    {"_heap", heap_get, heap_set, NULL, NULL},
    TICKS(leads, "_leads"),
    FIELD(WheelObject, levels, "_levels"),
    FIELD(WheelObject, overdue, "_overdue"),
    FIELD(WheelObject, slots1, "_slots1"),
    TICKS(spans, "_spans"),
    FIELD(WheelObject, todo, "_todo"),
    FIELD(WheelObject, memo_bucket, "memo_bucket"),
    {NULL},
};

static PyMemberDef wheel_members[] = {
    {"_lead1", Py_T_LONGLONG, offsetof(WheelObject, lead1), 0, NULL},
    {"_limit1", Py_T_LONGLONG, offsetof(WheelObject, limit1), 0, NULL},
    {"_memo_until", Py_T_LONGLONG, offsetof(WheelObject, memo_until), 0, NULL},
    {"_push_count", Py_T_LONGLONG, offsetof(WheelObject, push_count), 0, NULL},
    {"_span1", Py_T_LONGLONG, offsetof(WheelObject, span1), 0, NULL},
    {"memo_due", Py_T_LONGLONG, offsetof(WheelObject, memo_due), 0, NULL},
    {"memo_high", Py_T_LONGLONG, offsetof(WheelObject, memo_high), 0, NULL},
    {"memo_low", Py_T_LONGLONG, offsetof(WheelObject, memo_low), 0, NULL},
    {"_todo_done", Py_T_PYSSIZET, offsetof(WheelObject, todo_done), 0, NULL},
    {"_wheel_size", Py_T_PYSSIZET, offsetof(WheelObject, wheel_size), 0, NULL},
    {NULL},
};

/* Whether the wheel's fields are all set (the reference's __init__ ran) and agree: every
 * level has its tick, span, lead and list of `wheel_size` buckets. Else the reference. */
static int
wheel_ready_check(NativeState *st, WheelObject *w)
{
    if (!(w->levels != NULL && PyList_CheckExact(w->levels) && w->overdue != NULL &&
          (w->active == NULL || Bucket_Check(w->active)) &&
          Bucket_Check(w->overdue) && w->slots1 != NULL && PyList_CheckExact(w->slots1) &&
          w->todo != NULL && PyList_CheckExact(w->todo) && w->memo_bucket != NULL &&
          Bucket_Check(w->memo_bucket) && w->wheel_size >= 2 && w->heap_set &&
          w->current.v != NULL && w->spans.v != NULL && w->leads.v != NULL &&
          w->current.n >= 1 && w->spans.n == w->current.n && w->leads.n == w->current.n &&
          PyList_GET_SIZE(w->levels) == w->current.n)) {
        return 0;
    }
    for (Py_ssize_t level = 0; level < w->current.n; level++) {
        PyObject *slots = PyList_GET_ITEM(w->levels, level);
        if (!PyList_CheckExact(slots) || PyList_GET_SIZE(slots) != w->wheel_size) {
            return 0;
        }
    }
    return 1;
}

static inline int
wheel_ready(NativeState *st, WheelObject *o)
{
    return o->ready || (o->ready = (char)wheel_ready_check(st, o));
}

/* A wheel whose fields Python code replaced midway (from an entry's __hash__, say). */
static int
wheel_changed(void)
{
    PyErr_SetString(PyExc_RuntimeError, "the timing wheel's fields were replaced midway");
    return -1;
}

static inline long long
wheel_current(WheelObject *w)
{
    if (w->current.n < 1) {
        wheel_changed();
        return LLONG_MIN;
    }
    return w->current.v[0];
}

static inline void
wheel_forget_memo(WheelObject *w)
{
    w->memo_high = w->memo_low;
}

static int
wheel_push(WheelObject *w, PyObject *bucket, long long tick)
{
    w->push_count++;
    WheelItem item = {tick, w->push_count, -((BucketObject *)bucket)->level, bucket};
    return heap_push_item(w, item);
}

static void
wheel_advance_clock(WheelObject *w, long long now)
{
    if (w->current.n < 1 || now <= w->current.v[0]) {
        return;
    }
    w->current.v[0] = now;
    Py_ssize_t levels = w->current.n < w->spans.n ? w->current.n : w->spans.n;
    for (Py_ssize_t level = 1; level < levels; level++) {
        w->current.v[level] = now - floormod(now, w->spans.v[level]);
    }
    if (levels > 1) {
        w->limit1 = w->current.v[1] + w->span1 * (long long)w->wheel_size;
    }
}

/* _add_level(): a level on top, its buckets made by the reference's Bucket class (that of the
 * overdue bucket). The buckets are made first: their making runs Python code. */
static int
wheel_add_level(NativeState *st, WheelObject *w)
{
    Py_ssize_t size = w->wheel_size;
    long long factor = size >= 4 ? size / 2 : size;
    PyObject *kind = Py_NewRef((PyObject *)Py_TYPE(w->overdue));
    Py_ssize_t level = PyList_GET_SIZE(w->levels);
    PyObject *slots = PyList_New(size);
    for (Py_ssize_t i = 0; slots != NULL && i < size; i++) {
        PyObject *bucket = PyObject_CallFunction(kind, "On", (PyObject *)w, level);
        if (bucket == NULL) {
            Py_CLEAR(slots);
            break;
        }
        PyList_SET_ITEM(slots, i, bucket);
    }
    Py_DECREF(kind);
    if (slots == NULL) {
        return -1;
    }
    long long span;
    if (!wheel_ready(st, w) || PyList_GET_SIZE(w->levels) != level ||
        __builtin_mul_overflow(w->spans.v[w->spans.n - 1], factor, &span)) {
        Py_DECREF(slots);
        if (wheel_ready(st, w)) {
            PyErr_SetString(PyExc_OverflowError, "a level's span beyond a C long long");
            return -1;
        }
        return wheel_changed();
    }
    long long previous = w->current.v[w->current.n - 1];
    if (ticks_reserve(&w->spans, w->spans.n + 1) < 0 ||
        ticks_reserve(&w->leads, w->leads.n + 1) < 0 ||
        ticks_reserve(&w->current, w->current.n + 1) < 0 || PyList_Append(w->levels, slots) < 0) {
        Py_DECREF(slots);
        return -1;
    }
    ticks_append(&w->spans, span);
    ticks_append(&w->leads, size >= 4 ? span : 0);
    ticks_append(&w->current, previous - floormod(previous, span));
    if (level == 1) {
        w->span1 = span;
        w->lead1 = w->leads.v[1];
        set_field(&w->slots1, slots);
        w->limit1 = w->current.v[1] + span * (long long)size;
    }
    Py_DECREF(slots);
    return 0;
}

/* The bucket of slot `slot` (mod `size`) of a level's list (a new reference), or NULL with
 * an exception if Python code put anything else there. */
static inline PyObject *
slot_bucket(NativeState *st, PyObject *slots, long long slot, long long size)
{
    Py_ssize_t index = (Py_ssize_t)floormod(slot, size);
    if (!PyList_CheckExact(slots) || index >= PyList_GET_SIZE(slots) ||
        !Bucket_Check(PyList_GET_ITEM(slots, index))) {
        wheel_changed();
        return NULL;
    }
    return Py_NewRef(PyList_GET_ITEM(slots, index));
}

/* The bucket of the lowest overflow level that covers `deadline` (a new reference) and its due
 * tick. */
static PyObject *
wheel_overflow_bucket(NativeState *st, WheelObject *w, long long deadline, long long *due)
{
    long long size = (long long)w->wheel_size;
    Py_ssize_t level = 1;
    for (;;) {
        if (level == w->current.n && wheel_add_level(st, w) < 0) {
            return NULL;
        }
        if (!wheel_ready(st, w) || level >= w->current.n) {
            wheel_changed();
            return NULL;
        }
        long long span = w->spans.v[level], reach;
        if (__builtin_mul_overflow(span, size, &reach) ||
            __builtin_add_overflow(w->current.v[level], reach, &reach) || deadline < reach) {
            long long slot = floordiv(deadline, span);
            long long lead = w->leads.v[level];
            PyObject *bucket = slot_bucket(st, PyList_GET_ITEM(w->levels, level), slot, size);
            if (bucket == NULL) {
                return NULL;
            }
            long long start = slot * span;
            *due = start - lead;
            BucketObject *b = (BucketObject *)bucket;
            if (b->expiration != start) {
                b->expiration = start;
                if (wheel_push(w, bucket, *due) < 0) {
                    Py_DECREF(bucket);
                    return NULL;
                }
            }
            return bucket;
        }
        level++;
    }
}

/* The first level's bucket for `deadline` (its own tick), queued if its tick starts anew, and
 * remembered (the memo); a new reference, or NULL. */
static inline PyObject *
wheel_level0_bucket(NativeState *st, WheelObject *w, long long deadline, long long size)
{
    PyObject *bucket = slot_bucket(st, PyList_GET_ITEM(w->levels, 0), deadline, size);
    if (bucket == NULL) {
        return NULL;
    }
    BucketObject *b = (BucketObject *)bucket;
    if (b->expiration != deadline) {
        b->expiration = deadline;
        if (wheel_push(w, bucket, deadline) < 0) {
            Py_DECREF(bucket);
            return NULL;
        }
    }
    w->memo_low = deadline;
    w->memo_high = deadline + 1;
    w->memo_until = deadline;
    set_field(&w->memo_bucket, bucket);
    w->memo_due = deadline;
    return bucket;
}

/* The second level's bucket for `deadline`, due `lead1` before its span (`*due`), queued if its
 * span starts anew, and remembered for the deadlines it takes; a new reference, or NULL. */
static inline PyObject *
wheel_level1_bucket(NativeState *st, WheelObject *w, long long deadline, long long current,
                    long long size, long long *due)
{
    long long span = w->span1;
    long long slot = floordiv(deadline, span);
    PyObject *bucket = slot_bucket(st, w->slots1, slot, size);
    if (bucket == NULL) {
        return NULL;
    }
    long long start = slot * span;
    *due = start - w->lead1;
    BucketObject *b = (BucketObject *)bucket;
    if (b->expiration != start) {
        b->expiration = start;
        if (wheel_push(w, bucket, *due) < 0) {
            Py_DECREF(bucket);
            return NULL;
        }
    }
    long long low = current + size > start ? current + size : start;
    w->memo_low = low;
    long long high = start + span;
    w->memo_high = high < w->limit1 ? high : w->limit1;
    long long until = low - size + 1;
    w->memo_until = *due < until ? *due : until;
    set_field(&w->memo_bucket, bucket);
    w->memo_due = *due;
    return bucket;
}

/* The bucket for `deadline` when the memo does not hold it (overdue, the first or second
 * level, or a higher one), its due tick in `*due`; a new reference, or NULL. */
static inline PyObject *
wheel_choose_bucket(NativeState *st, WheelObject *w, long long deadline, long long *due)
{
    long long current = wheel_current(w);
    if (current == LLONG_MIN && PyErr_Occurred()) {
        return NULL;
    }
    long long size = (long long)w->wheel_size;
    if (deadline <= current) {
        *due = current;
        return Py_NewRef(w->overdue);
    }
    if (deadline < current + size) {
        *due = deadline;
        return wheel_level0_bucket(st, w, deadline, size);
    }
    if (deadline < w->limit1) {
        return wheel_level1_bucket(st, w, deadline, current, size, due);
    }
    return wheel_overflow_bucket(st, w, deadline, due);
}

/* add(entry, deadline): the due tick, or LLONG_MIN with an exception set. The bucket is held
 * from the moment it is chosen: a new level's buckets run Python code, and an entry that is not
 * an operation sets its fields through its own code. The insertion itself runs none. */
static long long
wheel_add(NativeState *st, WheelObject *w, PyObject *entry, long long deadline)
{
    /* (an entry that is not an operation sets its deadline through its own code) */
    if (entry_set_deadline(st, entry, deadline) < 0) {
        return LLONG_MIN;
    }
    if (!wheel_ready(st, w)) {
        wheel_changed();
        return LLONG_MIN;
    }
    PyObject *bucket;
    long long due;
    if (w->memo_low <= deadline && deadline < w->memo_high) {
        bucket = Py_NewRef(w->memo_bucket);
        due = w->memo_due;
    }
    else {
        bucket = wheel_choose_bucket(st, w, deadline, &due);
        if (bucket == NULL) {
            return LLONG_MIN;
        }
    }
    if (bucket_take(st, (BucketObject *)bucket, entry) < 0 ||
        entry_set_bucket(st, entry, bucket) < 0) {
        Py_DECREF(bucket);
        return LLONG_MIN;
    }
    Py_DECREF(bucket);
    return due;
}

static void
wheel_end_cascade(WheelObject *w)
{
    PyObject *bucket = w->active;
    w->active = NULL;
    PyObject *empty = PyList_New(0);
    if (empty != NULL) { /* (a failed allocation keeps the old list: harmless, it is done) */
        Py_SETREF(w->todo, empty);
    }
    if (bucket != NULL) {
        ((BucketObject *)bucket)->expiration = -1;
        Py_DECREF(bucket);
    }
    wheel_forget_memo(w);
}

static int
wheel_start_cascade(NativeState *st, WheelObject *w, PyObject *bucket)
{
    PyObject *todo = PyList_New(0); /* (may collect: the buckets are read after it) */
    if (todo == NULL) {
        return -1;
    }
    PyObject *older = ((BucketObject *)bucket)->older;
    if ((part_used(st, older) && bucket_extend((BucketObject *)older, todo) < 0) ||
        bucket_extend((BucketObject *)bucket, todo) < 0) {
        Py_DECREF(todo);
        return -1;
    }
    set_field(&w->active, bucket);
    Py_SETREF(w->todo, todo);
    w->todo_done = 0;
    return 0;
}

/* A cascade's step, as its entries read it: the bucket cascading and its older part, the level
 * below (its slots, span and lead), the wheel's current tick and size, and the due list. */
typedef struct {
    PyObject *bucket, *older, *slots, *due;
    int level;
    long long span, lead, current, size;
} Cascade;

/* `entry` cut out of the cascading bucket or its older part: 1, or 0 if it is in neither any
 * longer (code moved it: skipped), -1 on error. */
static inline int
cascade_unlink(NativeState *st, Cascade *c, PyObject *entry)
{
    PyObject *source = entry_bucket(st, entry);
    if (source == NULL) {
        return -1;
    }
    if (source == Py_None || (source != c->bucket && source != c->older)) {
        Py_DECREF(source);
        return 0;
    }
    PyObject *held = NULL;
    int err = bucket_cut(st, (BucketObject *)source, entry, &held);
    if (err == 0) {
        err = not_in_bucket(entry);
    }
    Py_DECREF(source);
    Py_XDECREF(held); /* (the entry is held by the caller: nothing is released) */
    return err < 0 ? -1 : 1;
}

/* The older part of the lower level's bucket for `deadline` (the bucket queued if its span
 * starts anew, the part made if it has none); a new reference, or NULL. */
static inline PyObject *
cascade_target(NativeState *st, WheelObject *w, Cascade *c, long long deadline)
{
    long long slot = floordiv(deadline, c->span);
    /* held to the end, as the reference's local `target`: making its older part runs Python
     * code (the bucket's class, a collection), which may take it out of the level's list and
     * the wheel's queue, the two that held it */
    PyObject *target = slot_bucket(st, c->slots, slot, c->size);
    if (target == NULL) {
        return NULL;
    }
    BucketObject *t = (BucketObject *)target;
    long long start = slot * c->span;
    if (t->expiration != start) {
        t->expiration = start;
        if (wheel_push(w, target, start - c->lead) < 0) {
            Py_DECREF(target);
            return NULL;
        }
    }
    PyObject *part = t->older;
    if (part == NULL || part == Py_None || !Bucket_Check(part)) {
        part = PyObject_CallFunction((PyObject *)Py_TYPE(target), "Oi", (PyObject *)w, c->level);
        if (part == NULL) {
            Py_DECREF(target);
            return NULL;
        }
        /* (the older value's release may run code: `part` is ours, not borrowed from `t`) */
        Py_XSETREF(t->older, Py_NewRef(part));
    }
    else {
        Py_INCREF(part);
    }
    Py_DECREF(target);
    return part;
}

/* One entry of the cascade (held by the caller): due (appended to `due`) or moved one level
 * down. 0, or -1 on error. */
static inline int
cascade_entry(NativeState *st, WheelObject *w, Cascade *c, PyObject *entry)
{
    int cut = cascade_unlink(st, c, entry);
    if (cut <= 0) {
        return cut;
    }
    long long deadline;
    if (entry_deadline(st, entry, &deadline) < 0) {
        return -1;
    }
    if (deadline <= c->current) {
        return PyList_Append(c->due, entry);
    }
    PyObject *part = cascade_target(st, w, c, deadline);
    if (part == NULL) {
        return -1;
    }
    int err = bucket_take(st, (BucketObject *)part, entry);
    if (err == 0) {
        err = entry_set_bucket(st, entry, part);
    }
    Py_DECREF(part);
    return err;
}

/* Move up to `limit` (< 0: all) entries of the cascade under way one level down. */
static int
wheel_cascade(NativeState *st, WheelObject *w, Py_ssize_t limit, PyObject *due)
{
    PyObject *bucket = w->active;
    BucketObject *b = (BucketObject *)bucket;
    /* (an older part Python code replaced by something else is no part: nothing to take) */
    PyObject *older = b->older == NULL || !Bucket_Check(b->older) ? Py_None : b->older;
    PyObject *todo = w->todo;
    Py_INCREF(bucket);
    Py_INCREF(older);
    Py_INCREF(todo);
    int result = -1;
    Py_ssize_t index = w->todo_done;
    Py_ssize_t end = PyList_GET_SIZE(todo);
    if (limit >= 0 && index + limit < end) {
        end = index + limit;
    }
    int level = b->level - 1;
    if (!wheel_ready(st, w) || level < 0 || level >= w->current.n) {
        wheel_changed();
        goto done;
    }
    Cascade c = {bucket, older, PyList_GET_ITEM(w->levels, level), due, level,
                 w->spans.v[level], w->leads.v[level], w->current.v[0], (long long)w->wheel_size};
    Py_INCREF(c.slots);
    for (; index < end; index++) {
        PyObject *entry = Py_NewRef(PyList_GET_ITEM(todo, index));
        int err = cascade_entry(st, w, &c, entry);
        Py_DECREF(entry);
        if (err < 0) {
            break;
        }
    }
    Py_DECREF(c.slots);
    if (index < end) {
        goto done;
    }
    w->todo_done = end;
    if (end == PyList_GET_SIZE(w->todo) && w->active == bucket) {
        wheel_end_cascade(w);
    }
    result = 0;
done:
    Py_DECREF(bucket);
    Py_DECREF(older);
    Py_DECREF(todo);
    return result;
}

/* The entries of `bucket` (and its older part first) appended to `due`; both emptied. */
static int
take_bucket(NativeState *st, PyObject *bucket, PyObject *due)
{
    PyObject *older = ((BucketObject *)bucket)->older;
    if (part_used(st, older) && bucket_take_all((BucketObject *)older, due) < 0) {
        return -1;
    }
    return bucket_take_all((BucketObject *)bucket, due);
}

/* The overdue bucket's entries appended to `due`, then due.sort(key=_deadline_of): stable, so
 * insertion order within a tick (the sort reads each entry's deadline: code of an entry's own
 * may run). 0, or -1 on error. */
static inline int
wheel_take_overdue(NativeState *st, WheelObject *w, PyObject *due)
{
    PyObject *overdue = w->overdue;
    if (!bucket_size(overdue)) {
        return 0;
    }
    Py_INCREF(overdue);
    int err = bucket_take_all((BucketObject *)overdue, due);
    Py_DECREF(overdue);
    if (err < 0) {
        return -1;
    }
    PyObject *sort_args[2] = {due, N.deadline_of};
    PyObject *sorted = PyObject_VectorcallMethod(N.s_sort, sort_args, 1, N.kw_key);
    if (sorted == NULL) {
        return -1;
    }
    Py_DECREF(sorted);
    return 0;
}

/* The queue's first bucket, due at `tick` (<= now), popped: its entries due (the first level),
 * or its cascade started (and run whole if its span began by `now` or there is no budget). */
static inline int
wheel_pop_due(NativeState *st, WheelObject *w, long long now, long long tick, Py_ssize_t budget,
              PyObject *due)
{
    PyObject *bucket = heap_pop(w); /* (held from here) */
    BucketObject *b = (BucketObject *)bucket;
    if (!bucket_in_use(st, bucket)) {
        b->expiration = -1;
        Py_DECREF(bucket);
        return 0;
    }
    wheel_advance_clock(w, tick);
    int err;
    if (b->level) {
        err = wheel_start_cascade(st, w, bucket) < 0 ||
                      ((budget < 0 || now >= b->expiration) && wheel_cascade(st, w, -1, due) < 0)
                  ? -1
                  : 0;
    }
    else {
        b->expiration = -1;
        err = take_bucket(st, bucket, due);
    }
    Py_DECREF(bucket);
    return err;
}

/* Every queued bucket due by `now`, in the queue's order; the cascade under way is finished
 * first when the next bucket is a higher level's or due at or after its span. 0, or -1. */
static inline int
wheel_take_queue(NativeState *st, WheelObject *w, long long now, Py_ssize_t budget, PyObject *due)
{
    while (w->heap_len) {
        long long tick = w->heap[0].tick;
        if (tick > now) {
            return 0;
        }
        PyObject *active = w->active;
        int err;
        if (active != NULL && active != Py_None &&
            (w->heap[0].neg_level || tick >= ((BucketObject *)active)->expiration)) {
            err = wheel_cascade(st, w, -1, due);
        }
        else {
            err = wheel_pop_due(st, w, now, tick, budget, due);
        }
        if (err < 0) {
            return -1;
        }
    }
    return 0;
}

/* advance(now, budget): a new list of the due entries, no longer held. `budget` < 0: none. */
static PyObject *
wheel_advance(NativeState *st, WheelObject *w, long long now, Py_ssize_t budget)
{
    if (!wheel_ready(st, w)) {
        wheel_changed();
        return NULL;
    }
    if (now >= w->memo_until) {
        w->memo_high = w->memo_low;
    }
    PyObject *due = PyList_New(0);
    if (due == NULL) {
        return NULL;
    }
    if (wheel_take_overdue(st, w, due) < 0) {
        goto error;
    }
    if (w->active != NULL && w->active != Py_None &&
        (budget < 0 || now >= ((BucketObject *)w->active)->expiration)) {
        if (wheel_cascade(st, w, -1, due) < 0) {
            goto error;
        }
    }
    if (wheel_take_queue(st, w, now, budget, due) < 0) {
        goto error;
    }
    wheel_advance_clock(w, now);
    if (w->active != NULL && w->active != Py_None && budget >= 0) {
        if (wheel_cascade(st, w, budget, due) < 0) {
            goto error;
        }
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(due); i++) {
        if (entry_set_bucket(st, PyList_GET_ITEM(due, i), Py_None) < 0) {
            goto error;
        }
    }
    return due;
error:
    Py_DECREF(due);
    return NULL;
}

/* next_deadline(): the tick at which advance next has work, TICK_INF if none; LLONG_MIN on
 * error. */
static long long
wheel_next_deadline(NativeState *st, WheelObject *w)
{
    if (!wheel_ready(st, w)) {
        wheel_changed();
        return LLONG_MIN;
    }
    if (bucket_size(w->overdue)) {
        return wheel_current(w);
    }
    PyObject *active = w->active;
    if (active != NULL && active != Py_None) {
        if (bucket_in_use(st, active)) {
            return wheel_current(w);
        }
        wheel_end_cascade(w);
    }
    while (w->heap_len) {
        if (bucket_in_use(st, w->heap[0].bucket)) {
            return w->heap[0].tick;
        }
        PyObject *bucket = heap_pop(w);
        ((BucketObject *)bucket)->expiration = -1;
        Py_DECREF(bucket);
        wheel_forget_memo(w);
    }
    return TICK_INF;
}

/* -- the methods as Python sees them ------------------------------------------------------------ */

#define WHEEL_SELF(self)                                                                         \
    if (!CORE_CHECK(self, WheelType) || !wheel_ready(st, (WheelObject *)self)) {                   \
        return NOT_HANDLED;                                                                      \
    }                                                                                            \
    WheelObject *w = (WheelObject *)self;

static PyObject *
wheel_add_native(NativeState *st, PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                 PyObject *kwnames)
{
    WHEEL_SELF(self)
    long long deadline;
    if (nargs != 2 || kwnames != NULL || !PyLong_CheckExact(args[1])) {
        return NOT_HANDLED;
    }
    if (as_tick(args[1], &deadline) < 0) {
        PyErr_Clear();
        return NOT_HANDLED;
    }
    Py_INCREF(self);
    long long due = wheel_add(st, w, args[0], deadline);
    Py_DECREF(self);
    if (due == LLONG_MIN) {
        return NULL;
    }
    return PyLong_FromLongLong(due);
}

static PyObject *
wheel_remove_native(NativeState *st, PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                    PyObject *kwnames)
{
    WHEEL_SELF(self)
    (void)w;
    if (nargs != 1 || kwnames != NULL) {
        return NOT_HANDLED;
    }
    PyObject *entry = args[0];
    PyObject *bucket = entry_bucket(st, entry);
    if (bucket == NULL) {
        return NULL;
    }
    if (bucket == Py_None) {
        Py_DECREF(bucket);
        Py_RETURN_FALSE;
    }
    int err = bucket_remove(st, bucket, entry);
    Py_DECREF(bucket);
    if (err < 0) {
        return NULL;
    }
    Py_RETURN_TRUE;
}

/* A budget argument: None (-1), or an int >= 0; anything else is the reference's. */
static inline int
budget_arg(PyObject *o, Py_ssize_t *out)
{
    if (o == Py_None) {
        *out = -1;
        return 1;
    }
    if (!PyLong_CheckExact(o)) {
        return 0;
    }
    *out = PyLong_AsSsize_t(o);
    if (*out < 0) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

/* advance(now, budget=None). A set-up wheel never goes to the reference (its heapq calls would
 * work on a copy of the queue): what the reference would take but C integers cannot hold, or
 * what is not a tick at all, is refused here. */
static PyObject *
wheel_advance_native(NativeState *st, PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                     PyObject *kwnames)
{
    WHEEL_SELF(self)
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    if (nargs < 1 || nargs + nkw > 2 ||
        (nkw == 1 && !PyUnicode_Check(PyTuple_GET_ITEM(kwnames, 0))) ||
        (nkw == 1 && PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "budget"))) {
        PyErr_SetString(PyExc_TypeError, "advance(now, budget=None)");
        return NULL;
    }
    long long now;
    Py_ssize_t budget = -1;
    if (!PyLong_Check(args[0])) {
        PyErr_Format(PyExc_TypeError, "now must be an int (a tick), got %R", args[0]);
        return NULL;
    }
    if (as_tick(args[0], &now) < 0) {
        return NULL;
    }
    if (nargs + nkw == 2 && !budget_arg(args[1], &budget)) {
        PyErr_Format(PyExc_TypeError, "budget must be an int >= 0 or None, got %R", args[1]);
        return NULL;
    }
    Py_INCREF(self);
    PyObject *due = wheel_advance(st, w, now, budget);
    Py_DECREF(self);
    return due;
}

/* _push(bucket, tick): the bucket queued at its due tick (the reference's own add calls it). */
static PyObject *
wheel_push_native(NativeState *st, PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                  PyObject *kwnames)
{
    WHEEL_SELF(self)
    long long tick;
    if (nargs != 2 || kwnames != NULL || !Bucket_Check(args[0]) || !PyLong_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "_push(bucket, tick)");
        return NULL;
    }
    if (as_tick(args[1], &tick) < 0 || wheel_push(w, args[0], tick) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
wheel_add_level_native(NativeState *st, PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                       PyObject *kwnames)
{
    WHEEL_SELF(self)
    if (nargs != 0 || kwnames != NULL) {
        PyErr_SetString(PyExc_TypeError, "_add_level()");
        return NULL;
    }
    Py_INCREF(self);
    int err = wheel_add_level(st, w);
    Py_DECREF(self);
    if (err < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
wheel_advance_clock_native(NativeState *st, PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                           PyObject *kwnames)
{
    WHEEL_SELF(self)
    long long now;
    if (nargs != 1 || kwnames != NULL || !PyLong_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "_advance_clock(now: int)");
        return NULL;
    }
    if (as_tick(args[0], &now) < 0) {
        return NULL;
    }
    wheel_advance_clock(w, now);
    Py_RETURN_NONE;
}

static PyObject *
wheel_next_deadline_native(NativeState *st, PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                           PyObject *kwnames)
{
    WHEEL_SELF(self)
    if (nargs != 0 || kwnames != NULL) {
        return NOT_HANDLED;
    }
    Py_INCREF(self);
    long long tick = wheel_next_deadline(st, w);
    Py_DECREF(self);
    if (tick == LLONG_MIN && PyErr_Occurred()) {
        return NULL;
    }
    return tick_or_inf(tick);
}
