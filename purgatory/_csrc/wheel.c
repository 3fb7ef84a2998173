/* The timing wheel's hot methods (purgatory/_wheel.py: add, remove, advance and its cascades,
 * next_deadline) over the reference's own data: buckets are dicts (a C subclass with the
 * reference's four fields), the heap is a list of (due tick, -level, push count, bucket)
 * tuples kept by heapq, the levels, spans, leads and current ticks are lists of ints. The cold
 * methods (construction, _add_level, iteration, the invariant check) stay the reference's.
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

/* -- the Bucket type: a dict with four fields -------------------------------------------------- */

static int
bucket_traverse(PyObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self)); /* (a heap type: its instances hold it) */
    BucketObject *b = (BucketObject *)self;
    Py_VISIT(b->older);
    Py_VISIT(b->wheel);
    return PyDict_Type.tp_traverse(self, visit, arg);
}

static int
bucket_clear(PyObject *self)
{
    BucketObject *b = (BucketObject *)self;
    Py_CLEAR(b->older);
    Py_CLEAR(b->wheel);
    return PyDict_Type.tp_clear(self);
}

static void
bucket_dealloc(PyObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    BucketObject *b = (BucketObject *)self;
    PyObject_GC_UnTrack(self);
    Py_CLEAR(b->older);
    Py_CLEAR(b->wheel);
    PyDict_Type.tp_dealloc(self);
    Py_DECREF(type); /* (a heap type: its instances hold it) */
}

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
    return PyDict_GET_SIZE(b);
}

/* A bucket or its older part (None, NULL or a bucket) holds something. */
static inline int
part_used(PyObject *part)
{
    return part != NULL && part != Py_None && PyDict_GET_SIZE(part) > 0;
}

static inline int
bucket_in_use(PyObject *b)
{
    return PyDict_GET_SIZE(b) > 0 || part_used(((BucketObject *)b)->older);
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

/* -- the wheel's fields ------------------------------------------------------------------------ */

static int
wheel_traverse(PyObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self)); /* (a heap type: its instances hold it) */
    WheelObject *w = (WheelObject *)self;
    Py_VISIT(w->active);
    Py_VISIT(w->current);
    Py_VISIT(w->heap);
    Py_VISIT(w->leads);
    Py_VISIT(w->levels);
    Py_VISIT(w->overdue);
    Py_VISIT(w->slots1);
    Py_VISIT(w->spans);
    Py_VISIT(w->todo);
    Py_VISIT(w->memo_bucket);
    return 0;
}

static int
wheel_clear(PyObject *self)
{
    WheelObject *w = (WheelObject *)self;
    Py_CLEAR(w->active);
    Py_CLEAR(w->current);
    Py_CLEAR(w->heap);
    Py_CLEAR(w->leads);
    Py_CLEAR(w->levels);
    Py_CLEAR(w->overdue);
    Py_CLEAR(w->slots1);
    Py_CLEAR(w->spans);
    Py_CLEAR(w->todo);
    Py_CLEAR(w->memo_bucket);
    return 0;
}

static void
wheel_dealloc(PyObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    wheel_clear(self);
    type->tp_free(self);
    Py_DECREF(type); /* (a heap type: its instances hold it) */
}

static PyGetSetDef wheel_getset[] = {
    FIELD_OR_NONE(WheelObject, active, "_active"),
    FIELD(WheelObject, current, "_current"),
    FIELD(WheelObject, heap, "_heap"),
    FIELD(WheelObject, leads, "_leads"),
    FIELD(WheelObject, levels, "_levels"),
    FIELD(WheelObject, overdue, "_overdue"),
    FIELD(WheelObject, slots1, "_slots1"),
    FIELD(WheelObject, spans, "_spans"),
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

/* Whether the wheel's fields are all set (the reference's __init__ ran): else the reference. */
static inline int
wheel_ready_check(NativeState *st, WheelObject *w)
{
    return w->current != NULL && PyList_CheckExact(w->current) && w->heap != NULL &&
           PyList_CheckExact(w->heap) && w->leads != NULL && PyList_CheckExact(w->leads) &&
           w->levels != NULL && PyList_CheckExact(w->levels) && w->overdue != NULL &&
           Bucket_Check(w->overdue) && w->slots1 != NULL && PyList_CheckExact(w->slots1) &&
           w->spans != NULL && PyList_CheckExact(w->spans) && w->todo != NULL &&
           PyList_CheckExact(w->todo) && w->memo_bucket != NULL &&
           Bucket_Check(w->memo_bucket) && w->wheel_size >= 2;
}

static inline int
wheel_ready(NativeState *st, WheelObject *o)
{
    return o->ready || (o->ready = (char)wheel_ready_check(st, o));
}

static inline int
list_tick(PyObject *list, Py_ssize_t i, long long *out)
{
    return as_tick(PyList_GET_ITEM(list, i), out);
}

static inline int
set_list_tick(PyObject *list, Py_ssize_t i, long long value)
{
    PyObject *v = PyLong_FromLongLong(value);
    if (v == NULL) {
        return -1;
    }
    return PyList_SetItem(list, i, v); /* steals */
}

static inline long long
wheel_current(WheelObject *w)
{
    long long c;
    if (list_tick(w->current, 0, &c) < 0) {
        return LLONG_MIN;
    }
    return c;
}

static inline void
wheel_forget_memo(WheelObject *w)
{
    w->memo_high = w->memo_low;
}

static int
wheel_push(NativeState *st, WheelObject *w, PyObject *bucket, long long tick)
{
    w->push_count++;
    PyObject *item = Py_BuildValue("(LiLO)", tick, -((BucketObject *)bucket)->level,
                                   w->push_count, bucket);
    if (item == NULL) {
        return -1;
    }
    int err = discard_result(call2(N.heappush, w->heap, item));
    Py_DECREF(item);
    return err;
}

static int
wheel_advance_clock(WheelObject *w, long long now)
{
    long long c0 = wheel_current(w);
    if (c0 == LLONG_MIN && PyErr_Occurred()) {
        return -1;
    }
    if (now <= c0) {
        return 0;
    }
    if (set_list_tick(w->current, 0, now) < 0) {
        return -1;
    }
    Py_ssize_t levels = PyList_GET_SIZE(w->current);
    for (Py_ssize_t level = 1; level < levels; level++) {
        long long span;
        if (list_tick(w->spans, level, &span) < 0 ||
            set_list_tick(w->current, level, now - floormod(now, span)) < 0) {
            return -1;
        }
    }
    if (levels > 1) {
        long long c1;
        if (list_tick(w->current, 1, &c1) < 0) {
            return -1;
        }
        w->limit1 = c1 + w->span1 * (long long)w->wheel_size;
    }
    return 0;
}

/* The bucket of the lowest overflow level that covers `deadline` (a new reference) and its due
 * tick. */
static PyObject *
wheel_overflow_bucket(NativeState *st, WheelObject *w, long long deadline, long long *due)
{
    long long size = (long long)w->wheel_size;
    Py_ssize_t level = 1;
    for (;;) {
        if (level == PyList_GET_SIZE(w->levels)) {
            if (discard_result(call_method0((PyObject *)w, N.s_add_level)) < 0) {
                return NULL;
            }
            if (level >= PyList_GET_SIZE(w->levels)) {
                PyErr_SetString(PyExc_RuntimeError, "_add_level added no level");
                return NULL;
            }
        }
        long long span, current;
        if (list_tick(w->spans, level, &span) < 0 ||
            list_tick(w->current, level, &current) < 0) {
            return NULL;
        }
        if (deadline < current + span * size) {
            long long slot = floordiv(deadline, span);
            long long lead;
            if (list_tick(w->leads, level, &lead) < 0) {
                return NULL;
            }
            PyObject *slots = PyList_GET_ITEM(w->levels, level);
            PyObject *bucket = Py_NewRef(PyList_GET_ITEM(slots, floormod(slot, size)));
            long long start = slot * span;
            *due = start - lead;
            BucketObject *b = (BucketObject *)bucket;
            if (b->expiration != start) {
                b->expiration = start;
                if (wheel_push(st, w, bucket, *due) < 0) {
                    Py_DECREF(bucket);
                    return NULL;
                }
            }
            return bucket;
        }
        level++;
    }
}

/* add(entry, deadline): the due tick, or LLONG_MIN with an exception set. The bucket is held
 * from the moment it is chosen: a push allocates (a collection may run code) and the insertion
 * runs the entry's __hash__. */
static long long
wheel_add(NativeState *st, WheelObject *w, PyObject *entry, long long deadline)
{
    if (entry_set_deadline(st, entry, deadline) < 0) {
        return LLONG_MIN;
    }
    PyObject *bucket;
    long long due;
    if (w->memo_low <= deadline && deadline < w->memo_high) {
        bucket = Py_NewRef(w->memo_bucket);
        due = w->memo_due;
    }
    else {
        long long current = wheel_current(w);
        if (current == LLONG_MIN && PyErr_Occurred()) {
            return LLONG_MIN;
        }
        long long size = (long long)w->wheel_size;
        if (deadline <= current) {
            bucket = Py_NewRef(w->overdue);
            due = current;
        }
        else if (deadline < current + size) {
            PyObject *slots = PyList_GET_ITEM(w->levels, 0);
            bucket = Py_NewRef(PyList_GET_ITEM(slots, floormod(deadline, size)));
            BucketObject *b = (BucketObject *)bucket;
            if (b->expiration != deadline) {
                b->expiration = deadline;
                if (wheel_push(st, w, bucket, deadline) < 0) {
                    Py_DECREF(bucket);
                    return LLONG_MIN;
                }
            }
            due = deadline;
            w->memo_low = deadline;
            w->memo_high = deadline + 1;
            w->memo_until = deadline;
            set_field(&w->memo_bucket, bucket);
            w->memo_due = due;
        }
        else if (deadline < w->limit1) {
            long long span = w->span1;
            long long slot = floordiv(deadline, span);
            bucket = Py_NewRef(PyList_GET_ITEM(w->slots1, floormod(slot, size)));
            long long start = slot * span;
            due = start - w->lead1;
            BucketObject *b = (BucketObject *)bucket;
            if (b->expiration != start) {
                b->expiration = start;
                if (wheel_push(st, w, bucket, due) < 0) {
                    Py_DECREF(bucket);
                    return LLONG_MIN;
                }
            }
            long long low = current + size;
            if (start > low) {
                low = start;
            }
            w->memo_low = low;
            long long high = start + span;
            w->memo_high = high < w->limit1 ? high : w->limit1;
            long long until = low - size + 1;
            w->memo_until = due < until ? due : until;
            set_field(&w->memo_bucket, bucket);
            w->memo_due = due;
        }
        else {
            bucket = wheel_overflow_bucket(st, w, deadline, &due);
            if (bucket == NULL) {
                return LLONG_MIN;
            }
        }
    }
    if (PyDict_SetItem(bucket, entry, Py_None) < 0 || entry_set_bucket(st, entry, bucket) < 0) {
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
wheel_start_cascade(WheelObject *w, PyObject *bucket)
{
    PyObject *older = ((BucketObject *)bucket)->older;
    PyObject *todo = part_used(older) ? PySequence_List(older) : PyList_New(0);
    if (todo == NULL) {
        return -1;
    }
    PyObject *keys = PyDict_Keys(bucket);
    if (keys == NULL) {
        Py_DECREF(todo);
        return -1;
    }
    Py_ssize_t n = PyList_GET_SIZE(todo);
    int err = PyList_SetSlice(todo, n, n, keys);
    Py_DECREF(keys);
    if (err < 0) {
        Py_DECREF(todo);
        return -1;
    }
    set_field(&w->active, bucket);
    Py_SETREF(w->todo, todo);
    w->todo_done = 0;
    return 0;
}

/* Move up to `limit` (< 0: all) entries of the cascade under way one level down. */
static int
wheel_cascade(NativeState *st, WheelObject *w, Py_ssize_t limit, PyObject *due)
{
    PyObject *bucket = w->active;
    BucketObject *b = (BucketObject *)bucket;
    PyObject *older = b->older == NULL ? Py_None : b->older;
    PyObject *todo = w->todo;
    Py_INCREF(bucket);
    Py_INCREF(older);
    Py_INCREF(todo);
    int result = -1;
    Py_ssize_t begin = w->todo_done;
    Py_ssize_t end = PyList_GET_SIZE(todo);
    if (limit >= 0 && begin + limit < end) {
        end = begin + limit;
    }
    int level = b->level - 1;
    PyObject *slots = PyList_GET_ITEM(w->levels, level);
    long long span, lead, current;
    long long size = (long long)w->wheel_size;
    if (list_tick(w->spans, level, &span) < 0 || list_tick(w->leads, level, &lead) < 0) {
        goto done;
    }
    current = wheel_current(w);
    if (current == LLONG_MIN && PyErr_Occurred()) {
        goto done;
    }
    Py_INCREF(slots);
    for (Py_ssize_t index = begin; index < end; index++) {
        PyObject *entry = PyList_GET_ITEM(todo, index);
        Py_INCREF(entry);
        PyObject *source = entry_bucket(st, entry);
        if (source == NULL) {
            Py_DECREF(entry);
            Py_DECREF(slots);
            goto done;
        }
        if (source == Py_None || (source != bucket && source != older)) {
            Py_DECREF(source);
            Py_DECREF(entry);
            continue;
        }
        int err = PyDict_DelItem(source, entry);
        Py_DECREF(source);
        long long deadline;
        if (err < 0 || entry_deadline(st, entry, &deadline) < 0) {
            Py_DECREF(entry);
            Py_DECREF(slots);
            goto done;
        }
        if (deadline <= current) {
            err = PyList_Append(due, entry);
            Py_DECREF(entry);
            if (err < 0) {
                Py_DECREF(slots);
                goto done;
            }
            continue;
        }
        long long slot = floordiv(deadline, span);
        PyObject *target = PyList_GET_ITEM(slots, floormod(slot, size));
        BucketObject *t = (BucketObject *)target;
        long long start = slot * span;
        if (t->expiration != start) {
            t->expiration = start;
            if (wheel_push(st, w, target, start - lead) < 0) {
                Py_DECREF(entry);
                Py_DECREF(slots);
                goto done;
            }
        }
        PyObject *part = t->older;
        if (part == NULL || part == Py_None) {
            part = PyObject_CallFunction((PyObject *)Py_TYPE(target), "Oi", (PyObject *)w, level);
            if (part == NULL) {
                Py_DECREF(entry);
                Py_DECREF(slots);
                goto done;
            }
            Py_XSETREF(t->older, part);
        }
        Py_INCREF(part);
        err = PyDict_SetItem(part, entry, Py_None);
        if (err == 0) {
            err = entry_set_bucket(st, entry, part);
        }
        Py_DECREF(part);
        Py_DECREF(entry);
        if (err < 0) {
            Py_DECREF(slots);
            goto done;
        }
    }
    Py_DECREF(slots);
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

/* The entries of `part` (a dict) appended to `due`; `part` emptied. */
static int
take_part(PyObject *part, PyObject *due)
{
    PyObject *keys = PyDict_Keys(part);
    if (keys == NULL) {
        return -1;
    }
    Py_ssize_t n = PyList_GET_SIZE(due);
    int err = PyList_SetSlice(due, n, n, keys);
    Py_DECREF(keys);
    if (err < 0) {
        return -1;
    }
    PyDict_Clear(part);
    return 0;
}

/* The entries of `bucket` (and its older part first) appended to `due`; both emptied. */
static int
take_bucket(PyObject *bucket, PyObject *due)
{
    PyObject *older = ((BucketObject *)bucket)->older;
    if (part_used(older) && take_part(older, due) < 0) {
        return -1;
    }
    if (PyDict_GET_SIZE(bucket) && take_part(bucket, due) < 0) {
        return -1;
    }
    return 0;
}

/* The heap's first item: its tick (and the bucket, borrowed). */
static inline int
heap_top(WheelObject *w, long long *tick, PyObject **bucket)
{
    PyObject *item = PyList_GET_ITEM(w->heap, 0);
    *bucket = PyTuple_GET_ITEM(item, 3);
    return as_tick(PyTuple_GET_ITEM(item, 0), tick);
}

static int
heap_pop(NativeState *st, WheelObject *w)
{
    return discard_result(call1(N.heappop, w->heap));
}

/* advance(now, budget): a new list of the due entries, no longer held. `budget` < 0: none. */
static PyObject *
wheel_advance(NativeState *st, WheelObject *w, long long now, Py_ssize_t budget)
{
    if (now >= w->memo_until) {
        w->memo_high = w->memo_low;
    }
    PyObject *due = PyList_New(0);
    if (due == NULL) {
        return NULL;
    }
    PyObject *overdue = w->overdue;
    Py_INCREF(overdue);
    if (PyDict_GET_SIZE(overdue)) {
        PyObject *keys = PyDict_Keys(overdue);
        if (keys == NULL) {
            goto error_overdue;
        }
        /* keys.sort(key=_deadline_of): stable, so insertion order within a tick */
        PyObject *sort_args[2] = {keys, N.deadline_of};
        PyObject *sorted = PyObject_VectorcallMethod(N.s_sort, sort_args, 1, N.kw_key);
        if (sorted == NULL) {
            Py_DECREF(keys);
            goto error_overdue;
        }
        Py_DECREF(sorted);
        Py_SETREF(due, keys);
        PyDict_Clear(overdue);
    }
    Py_DECREF(overdue);
    if (w->active != NULL && w->active != Py_None &&
        (budget < 0 || now >= ((BucketObject *)w->active)->expiration)) {
        if (wheel_cascade(st, w, -1, due) < 0) {
            goto error;
        }
    }
    while (PyList_GET_SIZE(w->heap)) {
        long long tick;
        PyObject *bucket;
        if (heap_top(w, &tick, &bucket) < 0) {
            goto error;
        }
        if (tick > now) {
            break;
        }
        PyObject *active = w->active;
        BucketObject *b = (BucketObject *)bucket;
        if (active != NULL && active != Py_None &&
            (b->level || tick >= ((BucketObject *)active)->expiration)) {
            if (wheel_cascade(st, w, -1, due) < 0) {
                goto error;
            }
            continue;
        }
        Py_INCREF(bucket);
        if (heap_pop(st, w) < 0) {
            Py_DECREF(bucket);
            goto error;
        }
        if (!bucket_in_use(bucket)) {
            b->expiration = -1;
            Py_DECREF(bucket);
            continue;
        }
        if (wheel_advance_clock(w, tick) < 0) {
            Py_DECREF(bucket);
            goto error;
        }
        if (b->level) {
            if (wheel_start_cascade(w, bucket) < 0 ||
                ((budget < 0 || now >= b->expiration) && wheel_cascade(st, w, -1, due) < 0)) {
                Py_DECREF(bucket);
                goto error;
            }
            Py_DECREF(bucket);
            continue;
        }
        b->expiration = -1;
        int err = take_bucket(bucket, due);
        Py_DECREF(bucket);
        if (err < 0) {
            goto error;
        }
    }
    if (wheel_advance_clock(w, now) < 0) {
        goto error;
    }
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
error_overdue:
    Py_DECREF(overdue);
error:
    Py_DECREF(due);
    return NULL;
}

/* next_deadline(): the tick at which advance next has work, TICK_INF if none; LLONG_MIN on
 * error. */
static long long
wheel_next_deadline(NativeState *st, WheelObject *w)
{
    if (PyDict_GET_SIZE(w->overdue)) {
        return wheel_current(w);
    }
    PyObject *active = w->active;
    if (active != NULL && active != Py_None) {
        if (bucket_in_use(active)) {
            return wheel_current(w);
        }
        wheel_end_cascade(w);
    }
    while (PyList_GET_SIZE(w->heap)) {
        long long tick;
        PyObject *bucket;
        if (heap_top(w, &tick, &bucket) < 0) {
            return LLONG_MIN;
        }
        if (bucket_in_use(bucket)) {
            return tick;
        }
        Py_INCREF(bucket);
        if (heap_pop(st, w) < 0) {
            Py_DECREF(bucket);
            return LLONG_MIN;
        }
        ((BucketObject *)bucket)->expiration = -1;
        Py_DECREF(bucket);
        wheel_forget_memo(w);
    }
    return TICK_INF;
}

/* -- the methods as Python sees them ------------------------------------------------------------ */

#define WHEEL_SELF(self)                                                                         \
    if (!CORE_CHECK(self, WheelType) || !wheel_ready(st, (WheelObject *)self)) {            \
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
    int err = PyObject_DelItem(bucket, entry);
    Py_DECREF(bucket);
    if (err < 0 || entry_set_bucket(st, entry, Py_None) < 0) {
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

static PyObject *
wheel_advance_native(NativeState *st, PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                     PyObject *kwnames)
{
    WHEEL_SELF(self)
    if (nargs < 1 || nargs > 2 || kwnames != NULL || !PyLong_CheckExact(args[0])) {
        return NOT_HANDLED;
    }
    long long now;
    Py_ssize_t budget = -1;
    if (as_tick(args[0], &now) < 0) {
        PyErr_Clear();
        return NOT_HANDLED;
    }
    if (nargs == 2 && !budget_arg(args[1], &budget)) {
        return NOT_HANDLED;
    }
    Py_INCREF(self);
    PyObject *due = wheel_advance(st, w, now, budget);
    Py_DECREF(self);
    return due;
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
