/* The watcher lists' hot methods (purgatory/_watchers.py: register, trigger, purge) over the
 * reference's own data: a key's watchers are the lone operation, an insertion-ordered dict used
 * as a set, or a ThresholdWatchers (purgatory/_thresholds.py, whose five fields are C fields
 * here). The rare shapes (a key growing from plain to thresholds, a list of operations under
 * one threshold, a failure half-way) call the reference's own methods for that step. */

/* -- ThresholdWatchers' fields ------------------------------------------------------------------ */

static int
threshold_traverse(PyObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self)); /* (a heap type: its instances hold it) */
    ThresholdObject *t = (ThresholdObject *)self;
    Py_VISIT(t->plain);
    Py_VISIT(t->at);
    Py_VISIT(t->run);
    Py_VISIT(t->heap);
    Py_VISIT(t->shape);
    Py_VISIT(t->run_append);
    Py_VISIT(t->run_popleft);
    return 0;
}

static int
threshold_clear(PyObject *self)
{
    ThresholdObject *t = (ThresholdObject *)self;
    Py_CLEAR(t->plain);
    Py_CLEAR(t->at);
    Py_CLEAR(t->run);
    Py_CLEAR(t->heap);
    Py_CLEAR(t->shape);
    Py_CLEAR(t->run_append);
    Py_CLEAR(t->run_popleft);
    return 0;
}

static void
threshold_dealloc(PyObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    threshold_clear(self);
    type->tp_free(self);
    Py_DECREF(type); /* (a heap type: its instances hold it) */
}

static PyGetSetDef threshold_getset[] = {
    FIELD(ThresholdObject, shape, "shape"),
    FIELD(ThresholdObject, plain, "plain"),
    FIELD(ThresholdObject, at, "at"),
    FIELD(ThresholdObject, run, "run"),
    FIELD(ThresholdObject, heap, "heap"),
    {NULL},
};

static PyMemberDef threshold_members[] = {
    {"dead", Py_T_PYSSIZET, offsetof(ThresholdObject, dead), 0, NULL},
    {NULL},
};

static int
threshold_ready_check(NativeState *st, ThresholdObject *t)
{
    Py_CLEAR(t->run_append);
    Py_CLEAR(t->run_popleft);
    if (t->run == NULL || (PyObject *)Py_TYPE(t->run) != N.deque_type) {
        return 0;
    }
    t->run_append = PyObject_GetAttr(t->run, N.s_append);
    t->run_popleft = PyObject_GetAttr(t->run, N.s_popleft);
    if (t->run_append == NULL || t->run_popleft == NULL) {
        PyErr_Clear();
        return 0;
    }
    return t->plain != NULL && PyDict_CheckExact(t->plain) && t->at != NULL &&
           PyDict_CheckExact(t->at) && t->run != NULL && t->heap != NULL &&
           PyList_CheckExact(t->heap);
}

static inline int
threshold_ready(NativeState *st, PyObject *o)
{
    ThresholdObject *t = (ThresholdObject *)o;
    return t->ready || (t->ready = (char)threshold_ready_check(st, t));
}


/* -- WatcherLists' fields ----------------------------------------------------------------------- */

static int
lists_traverse(PyObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self)); /* (a heap type: its instances hold it) */
    Py_VISIT(((ListsObject *)self)->lists);
    Py_VISIT(((ListsObject *)self)->queue);
    return 0;
}

static int
lists_clear(PyObject *self)
{
    Py_CLEAR(((ListsObject *)self)->lists);
    Py_CLEAR(((ListsObject *)self)->queue);
    return 0;
}

static void
lists_dealloc(PyObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    lists_clear(self);
    type->tp_free(self);
    Py_DECREF(type); /* (a heap type: its instances hold it) */
}

static PyGetSetDef lists_getset[] = {
    FIELD(ListsObject, lists, "_lists"),
    FIELD(ListsObject, queue, "queue"),
    {NULL},
};

static PyMemberDef lists_members[] = {
    {"_entries", Py_T_PYSSIZET, offsetof(ListsObject, entries), 0, NULL},
    {"_purged", Py_T_PYSSIZET, offsetof(ListsObject, purged), 0, NULL},
    {NULL},
};

static inline int
lists_ready_check(ListsObject *l)
{
    return l->lists != NULL && PyDict_CheckExact(l->lists) && l->queue != NULL &&
           PyDict_CheckExact(l->queue);
}

static inline int
lists_ready(ListsObject *o)
{
    return o->ready || (o->ready = (char)lists_ready_check(o));
}

static inline void
op_mark_listed(OpObject *op, Py_ssize_t listed)
{
    op->listed = listed;
    OP_SET(op) |= SET_LISTED;
}

/* An entry of `op` left a list: one entry less; out of the purge queue once on none. */
static inline int
lists_left(NativeState *st, ListsObject *l, OpObject *op)
{
    l->entries--;
    op->listed--;
    if (!op->listed) {
        PyObject *queue = Py_NewRef(l->queue); /* (the lookup runs op's __hash__) */
        int err = dict_discard(queue, (PyObject *)op);
        Py_DECREF(queue);
        if (err < 0) {
            return -1;
        }
    }
    return 0;
}

/* -- entries that are not operations ------------------------------------------------------------ */

/* The reference's lists hold whatever was watched: an object that is not a DelayedOperation but
 * has its fields (`_state`, `_listed`, `_keys`, `_marks`) is read and written as Python does,
 * never through the C layout. These run only for such objects. */

/* `o._state` (an int) into *state: 0, or -1 with an exception set. */
static int
entry_state_slow(PyObject *o, int *state)
{
    PyObject *v = PyObject_GetAttrString(o, "_state");
    if (v == NULL) {
        return -1;
    }
    long x = PyLong_AsLong(v);
    Py_DECREF(v);
    if (x == -1 && PyErr_Occurred()) {
        return -1;
    }
    *state = (int)x;
    return 0;
}

static inline int
entry_state(NativeState *st, PyObject *o, int *state)
{
    if (Op_Check(o)) {
        *state = ((OpObject *)o)->state;
        return 0;
    }
    return entry_state_slow(o, state);
}

/* An entry of `o` left a list (`WatcherLists.left`). */
static inline int
entry_left(NativeState *st, ListsObject *l, PyObject *o)
{
    if (Op_Check(o)) {
        return lists_left(st, l, (OpObject *)o);
    }
    return discard_result(PyObject_CallMethod((PyObject *)l, "left", "O", o));
}

/* `o._listed = 0` (the purge's). */
static inline int
entry_unlisted(NativeState *st, PyObject *o)
{
    if (Op_Check(o)) {
        op_mark_listed((OpObject *)o, 0);
        return 0;
    }
    PyObject *zero = PyLong_FromLong(0);
    int err = zero == NULL ? -1 : PyObject_SetAttrString(o, "_listed", zero);
    Py_XDECREF(zero);
    return err;
}

/* -- registration ------------------------------------------------------------------------------- */

/* `op` as a plain watcher of `key` (the plain path of register), whose watchers in `lists`
 * (the lists' dict) were `ops` (NULL: none) when looked up: 1 if added, 0 if it already watched
 * the key, -1 on error. The caller holds `lists` and `ops`: every insertion may run a key's or
 * an operation's __hash__. A lone watcher whose marks are a dict (the lookup in them is user
 * code that may change the key's watchers) is the reference's `_join_plain`, which looks again
 * after it. */
static int
register_plain(NativeState *st, ListsObject *l, PyObject *lists, OpObject *op, PyObject *key,
               PyObject *ops)
{
    if (ops == NULL) {
        return PyDict_SetItem(lists, key, (PyObject *)op) < 0 ? -1 : 1;
    }
    if (ops == (PyObject *)op) {
        return 0;
    }
    int result = -1;
    if (PyDict_CheckExact(ops)) {
        int found = PyDict_Contains(ops, (PyObject *)op);
        result = found < 0 ? -1 : found ? 0 : (PyDict_SetItem(ops, (PyObject *)op, Py_None) < 0 ? -1 : 1);
    }
    else if (Op_Check(ops) && (((OpObject *)ops)->marks == NULL || ((OpObject *)ops)->marks == Py_None)) {
        /* a plain lone watcher: the two make an ordered set */
        PyObject *set = PyDict_New();
        if (set != NULL) {
            if (PyDict_SetItem(set, ops, Py_None) == 0 &&
                PyDict_SetItem(set, (PyObject *)op, Py_None) == 0 &&
                PyDict_SetItem(lists, key, set) == 0) {
                result = 1;
            }
            Py_DECREF(set);
        }
    }
    else {
        PyObject *r = call_method3((PyObject *)l, N.s_join_plain, key, (PyObject *)op, ops);
        if (r != NULL) {
            result = PyObject_IsTrue(r);
            Py_DECREF(r);
        }
    }
    return result;
}

/* The fallback of register_at for a key whose watchers are a lone operation or an ordered set:
 * `self._join_at(key, op, ops, threshold)`. */
static int
register_join_at(NativeState *st, ListsObject *l, OpObject *op, PyObject *key, PyObject *ops,
                 PyObject *threshold)
{
    PyObject *args[5] = {(PyObject *)l, key, (PyObject *)op, ops, threshold};
    return discard_result(PyObject_VectorcallMethod(
               N.s_join_at, args, 5 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL)) < 0
               ? -1
               : 1;
}

/* `op` at `threshold` on `key`, whose watchers in `lists` were `ops` (NULL: none; both held by
 * the caller): 1 if added, 0 if it already watched the key, -1 on error. The threshold's
 * lookup and comparisons may run its own code: what they read is held across them. */
static int
register_at(NativeState *st, ListsObject *l, PyObject *lists, OpObject *op, PyObject *key,
            PyObject *threshold,
            PyObject *ops)
{
    if (ops == NULL) {
        return PyDict_SetItem(lists, key, (PyObject *)op) < 0 ? -1 : 1;
    }
    if (ops == (PyObject *)op) {
        return 0;
    }
    int result = -1;
    if (Threshold_Check(ops) && threshold_ready(st, ops)) {
        ThresholdObject *t = (ThresholdObject *)ops;
        PyObject *at = t->at;
        Py_INCREF(at);
        PyObject *waiting = PyDict_GetItemWithError(at, threshold);
        Py_XINCREF(waiting);
        if (waiting == NULL) {
            if (PyErr_Occurred()) {
                goto at_done;
            }
            PyObject *run = t->run, *heap = t->heap, *append = t->run_append;
            Py_INCREF(run);
            Py_INCREF(heap);
            Py_INCREF(append);
            int in_run = 0;
            if (PyList_GET_SIZE(heap) == 0) {
                Py_ssize_t n = PyObject_Size(run);
                if (n < 0) {
                    goto queue_done;
                }
                if (n == 0) {
                    in_run = 1;
                }
                else {
                    PyObject *last = PySequence_GetItem(run, n - 1);
                    if (last == NULL) {
                        goto queue_done;
                    }
                    in_run = compare_values(last, threshold, Py_LE);
                    Py_DECREF(last);
                    if (in_run < 0) {
                        goto queue_done;
                    }
                }
            }
            if (in_run) {
                if (discard_result(call1(append, threshold)) < 0) {
                    goto queue_done;
                }
            }
            else if (discard_result(call2(N.heappush, heap, threshold)) < 0) {
                PyObject *exc = fetch_exception();
                PyObject *r = call_method1(ops, N.s_unpush, threshold);
                if (r == NULL) {
                    Py_DECREF(exc);
                    goto queue_done;
                }
                Py_DECREF(r);
                restore_exception(exc);
                goto queue_done;
            }
            result = PyDict_SetItem(at, threshold, (PyObject *)op) < 0 ? -1 : 1;
        queue_done:
            Py_DECREF(run);
            Py_DECREF(heap);
            Py_DECREF(append);
        }
        else if (waiting == (PyObject *)op) {
            result = 0;
        }
        else if (PyList_CheckExact(waiting)) {
            int found = PySequence_Contains(waiting, (PyObject *)op);
            result = found < 0 ? -1 : found ? 0 : (PyList_Append(waiting, (PyObject *)op) < 0 ? -1 : 1);
        }
        else {
            PyObject *pair = PyList_New(2);
            if (pair != NULL) {
                PyList_SET_ITEM(pair, 0, Py_NewRef(waiting));
                PyList_SET_ITEM(pair, 1, Py_NewRef((PyObject *)op));
                result = PyDict_SetItem(at, threshold, pair) < 0 ? -1 : 1;
                Py_DECREF(pair);
            }
        }
    at_done:
        Py_XDECREF(waiting);
        Py_DECREF(at);
    }
    else {
        result = register_join_at(st, l, op, key, ops, threshold);
    }
    return result;
}

/* register(op, keys, marks) with `keys` a tuple; -1 with nothing registered on error. */
static int
lists_register(NativeState *st, ListsObject *l, OpObject *op, PyObject *keys, PyObject *marks)
{
    set_field(&op->marks, marks);
    set_field(&op->keys, keys);
    /* counted from zero and added to at the end: a key's code may cancel or trigger a key `op`
     * is on already, which counts it off meanwhile */
    op_mark_listed(op, 0);
    Py_ssize_t n = PyTuple_GET_SIZE(keys);
    Py_ssize_t listed = n;
    PyObject *mapping = PyDict_CheckExact(marks) ? marks : NULL;
    /* the reference's `lists = self._lists`: held, whatever a key's code assigns meanwhile */
    PyObject *lists = Py_NewRef(l->lists);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = PyTuple_GET_ITEM(keys, i);
        /* the key's watchers first, then its threshold: the reference's order of lookups */
        PyObject *ops = PyDict_GetItemWithError(lists, key);
        if (ops == NULL && PyErr_Occurred()) {
            goto fail;
        }
        Py_XINCREF(ops);
        int added;
        if (marks == Py_None) {
            added = register_plain(st, l, lists, op, key, ops);
        }
        else {
            PyObject *threshold = marks;
            if (mapping != NULL) {
                threshold = PyDict_GetItemWithError(mapping, key);
                if (threshold == NULL) {
                    if (!PyErr_Occurred()) {
                        PyErr_SetObject(PyExc_KeyError, key);
                    }
                    Py_XDECREF(ops);
                    goto fail;
                }
            }
            if (threshold == Py_None) {
                added = register_plain(st, l, lists, op, key, ops);
            }
            else {
                Py_INCREF(threshold);
                added = register_at(st, l, lists, op, key, threshold, ops);
                Py_DECREF(threshold);
            }
        }
        Py_XDECREF(ops);
        if (added < 0) {
            goto fail;
        }
        if (added == 0) {
            listed--;
        }
    }
    Py_DECREF(lists);
    op_mark_listed(op, op->listed + listed);
    l->entries += listed;
    return 0;
fail:;
    Py_DECREF(lists);
    PyObject *exc = fetch_exception();
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = call_method2((PyObject *)l, N.s_discard, PyTuple_GET_ITEM(keys, i),
                                   (PyObject *)op);
        if (r != NULL) {
            Py_DECREF(r);
            continue;
        }
        PyObject *again = fetch_exception();
        if (!PyErr_GivenExceptionMatches(again, PyExc_Exception)) {
            Py_DECREF(exc);
            restore_exception(again);
            op_mark_listed(op, 0);
            return -1;
        }
        Py_DECREF(again);
    }
    op_mark_listed(op, 0);
    restore_exception(exc);
    return -1;
}

/* -- the trigger -------------------------------------------------------------------------------- */

/* Kinds of `drop` in the reference's trigger. */
#define DROP_DICT 0      /* ops.pop / plain.pop: a dict */
#define DROP_THRESHOLD 1 /* partial(ops.pop, key=key): ThresholdWatchers.pop */
#define DROP_NOTHING 2   /* a lone watcher: its entry goes after the loop */

/* `drop(op, _NOTHING_TO_POP) is None`: 1 if `op` was taken off, 0 if not, -1 on error. */
static int
trigger_drop(NativeState *st, int kind, PyObject *container, PyObject *op, PyObject *key)
{
    if (kind == DROP_DICT) {
        PyObject *v;
        int found = dict_pop(container, op, &v);
        if (found <= 0) {
            return found;
        }
        int is_none = v == Py_None;
        Py_DECREF(v);
        return is_none;
    }
    if (kind == DROP_THRESHOLD) {
        PyObject *args[4] = {container, op, N.nothing_to_pop, key};
        PyObject *r = PyObject_VectorcallMethod(N.s_pop, args, 4 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                                NULL);
        if (r == NULL) {
            return -1;
        }
        int is_none = r == Py_None;
        Py_DECREF(r);
        return is_none;
    }
    return 0;
}

/* A released operation: into `plain`, or off the key if it finished through another key. */
static int
release_one(NativeState *st, ListsObject *l, PyObject *plain, PyObject *op)
{
    int state;
    Py_INCREF(op); /* (the plain's insertion runs its __hash__: it may leave `waiting`) */
    int err = entry_state(st, op, &state);
    if (err == 0) {
        err = state & ST_FINISHED ? entry_left(st, l, op) : PyDict_SetItem(plain, op, Py_None);
    }
    Py_DECREF(op);
    return err;
}

/* Release every threshold <= reached of `t` into its plain watchers (finished ones leave). */
static int
trigger_release(NativeState *st, ListsObject *l, ThresholdObject *t, PyObject *reached)
{
    PyObject *run = t->run, *heap = t->heap, *at = t->at, *plain = t->plain;
    PyObject *popleft = t->run_popleft; /* (the run's, as the reference's local `run`) */
    Py_INCREF(run);
    Py_INCREF(heap);
    Py_INCREF(at);
    Py_INCREF(plain);
    Py_INCREF(popleft);
    int result = -1;
    for (;;) {
        PyObject *threshold = NULL;
        Py_ssize_t in_run = PyObject_Size(run);
        if (in_run < 0) {
            goto done;
        }
        int from_heap;
        if (in_run) {
            threshold = PySequence_GetItem(run, 0);
            if (threshold == NULL) {
                goto done;
            }
            from_heap = 0;
            if (PyList_GET_SIZE(heap)) {
                PyObject *top = PyList_GET_ITEM(heap, 0);
                Py_INCREF(top);
                int lower = compare_values(top, threshold, Py_LT);
                if (lower < 0) {
                    Py_DECREF(top);
                    Py_DECREF(threshold);
                    goto done;
                }
                if (lower) {
                    Py_SETREF(threshold, top);
                    from_heap = 1;
                }
                else {
                    Py_DECREF(top);
                }
            }
        }
        else if (PyList_GET_SIZE(heap)) {
            threshold = Py_NewRef(PyList_GET_ITEM(heap, 0));
            from_heap = 1;
        }
        else {
            break;
        }
        int reached_it = compare_values(threshold, reached, Py_LE);
        if (reached_it <= 0) {
            Py_DECREF(threshold);
            if (reached_it < 0) {
                goto done;
            }
            break;
        }
        /* The comparisons may have run the threshold's own code, which may cancel or trigger
         * this key: the head is taken only if it still is the head (the reference's check). */
        int still_head;
        if (from_heap) {
            still_head = PyList_GET_SIZE(heap) && PyList_GET_ITEM(heap, 0) == threshold;
        }
        else {
            PyObject *head = PyObject_Size(run) > 0 ? PySequence_GetItem(run, 0) : NULL;
            if (head == NULL && PyErr_Occurred()) {
                Py_DECREF(threshold);
                goto done;
            }
            still_head = head == threshold;
            Py_XDECREF(head);
        }
        if (!still_head) {
            Py_DECREF(threshold);
            continue;
        }
        PyObject *r = from_heap ? call1(N.heappop, heap) : PyObject_CallNoArgs(popleft);
        if (r == NULL) {
            Py_DECREF(threshold);
            goto done;
        }
        Py_DECREF(r);
        PyObject *waiting;
        int found = dict_pop(at, threshold, &waiting);
        Py_DECREF(threshold);
        if (found <= 0) {
            if (found < 0) {
                goto done;
            }
            t->dead--;
            continue;
        }
        int err = 0;
        if (PyList_CheckExact(waiting)) { /* several under one threshold */
            for (Py_ssize_t i = 0; i < PyList_GET_SIZE(waiting) && err == 0; i++) {
                err = release_one(st, l, plain, PyList_GET_ITEM(waiting, i));
            }
        }
        else {
            err = release_one(st, l, plain, waiting);
        }
        Py_DECREF(waiting);
        if (err < 0) {
            goto done;
        }
    }
    result = 0;
done:
    Py_DECREF(run);
    Py_DECREF(heap);
    Py_DECREF(at);
    Py_DECREF(plain);
    Py_DECREF(popleft);
    return result;
}

/* The threshold of `op` on `key` (a new reference; None: plain), from its marks. The lookup runs
 * the key's __eq__, which may replace the marks (a trigger of another key releases `op` there):
 * the dict is held across it. Not an operation: the reference's `threshold_of`. */
static PyObject *
op_threshold_of(NativeState *st, PyObject *o, PyObject *key)
{
    if (!Op_Check(o)) {
        return call2(N.threshold_of, o, key);
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

/* trigger(key, reached, attempt): how many completed, or -1 on error. */
static Py_ssize_t
lists_trigger(NativeState *st, ListsObject *l, PyObject *key, PyObject *reached, PyObject *attempt)
{
    PyObject *lists = Py_NewRef(l->lists); /* the reference's `lists = self._lists`: held */
    PyObject *ops = PyDict_GetItemWithError(lists, key);
    if (ops == NULL) {
        Py_DECREF(lists);
        return PyErr_Occurred() ? -1 : 0;
    }
    Py_INCREF(ops);
    PyObject *single = NULL; /* borrowed: `ops` itself */
    PyObject *candidates = NULL;
    PyObject *container = NULL;
    int kind;
    Py_ssize_t completed = -1;
    if (PyDict_CheckExact(ops)) {
        candidates = PySequence_List(ops); /* (its iterator: cheaper than PyDict_Keys) */
        container = Py_NewRef(ops);
        kind = DROP_DICT;
    }
    else if (Threshold_Check(ops) && threshold_ready(st, ops)) {
        ThresholdObject *t = (ThresholdObject *)ops;
        if (reached == Py_None) {
            candidates = PySequence_List(ops);
            container = Py_NewRef(ops);
            kind = DROP_THRESHOLD;
        }
        else {
            if (trigger_release(st, l, t, reached) < 0) {
                goto out;
            }
            container = Py_NewRef(t->plain);
            candidates = PySequence_List(container);
            kind = DROP_DICT;
        }
    }
    else {
        if (reached != Py_None && Op_Check(ops)) {
            PyObject *threshold = op_threshold_of(st, ops, key);
            if (threshold == NULL) {
                goto out;
            }
            if (threshold != Py_None) {
                int reached_it = compare_values(threshold, reached, Py_LE);
                Py_DECREF(threshold);
                if (reached_it < 0) {
                    goto out;
                }
                if (!reached_it) {
                    completed = 0;
                    goto out;
                }
                if (discard_result(call2(N.release_lone, ops, key)) < 0) {
                    goto out;
                }
            }
            else {
                Py_DECREF(threshold);
            }
        }
        single = ops;
        candidates = PyList_New(1);
        if (candidates != NULL) {
            PyList_SET_ITEM(candidates, 0, Py_NewRef(ops));
        }
        kind = DROP_NOTHING;
    }
    if (candidates == NULL) {
        goto out;
    }
    Py_ssize_t done = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(candidates); i++) {
        PyObject *item = PyList_GET_ITEM(candidates, i);
        int state;
        int dropped;
        Py_INCREF(item);
        if (entry_state(st, item, &state) < 0) {
            Py_DECREF(item);
            goto tidy;
        }
        if (!state) {
            PyObject *claimed = call_op_method(item, M_TRY_COMPLETE);
            if (claimed == NULL) {
                PyObject *exc = fetch_exception();
                if (is_interrupt(exc)) {
                    restore_exception(exc);
                    Py_DECREF(item);
                    goto tidy;
                }
                PyObject *r = call3(N.report_attempt, item, key, exc);
                Py_DECREF(exc);
                Py_DECREF(item);
                if (r == NULL) {
                    goto tidy;
                }
                Py_DECREF(r);
                continue;
            }
            if (entry_state(st, item, &state) < 0) {
                Py_DECREF(claimed);
                Py_DECREF(item);
                goto tidy;
            }
            if (state & ST_FINISHED) {
                Py_DECREF(claimed);
                dropped = trigger_drop(st, kind, container, item, key);
                if (dropped < 0 || (dropped && entry_left(st, l, item) < 0)) {
                    Py_DECREF(item);
                    goto tidy;
                }
                if ((state & ST_EXPIRED_NOW) == ST_DONE) {
                    done++;
                }
            }
            else {
                int truth = PyObject_IsTrue(claimed);
                PyObject *r = NULL;
                if (truth > 0) {
                    r = call2(N.report_false_claim, item, claimed);
                }
                Py_DECREF(claimed);
                if (truth < 0 || (truth > 0 && r == NULL)) {
                    Py_DECREF(item);
                    goto tidy;
                }
                Py_XDECREF(r);
            }
        }
        else if (state & ST_FINISHED) {
            dropped = trigger_drop(st, kind, container, item, key);
            if (dropped < 0 || (dropped && entry_left(st, l, item) < 0)) {
                Py_DECREF(item);
                goto tidy;
            }
        }
        else if (discard_result(call1(attempt, item)) < 0) {
            Py_DECREF(item);
            goto tidy;
        }
        Py_DECREF(item);
    }
    /* the end of the trigger (the callbacks ran: `ops` is read again as it is now) */
    int single_state = 0;
    if (single == NULL) {
        int emptied;
        if (PyDict_CheckExact(ops)) {
            emptied = PyDict_GET_SIZE(ops) == 0;
        }
        else if (Threshold_Check(ops) && threshold_ready(st, ops)) {
            ThresholdObject *t = (ThresholdObject *)ops;
            emptied = PyDict_GET_SIZE(t->plain) == 0 && PyDict_GET_SIZE(t->at) == 0;
        }
        else if (discard_result(call_method3((PyObject *)l, N.s_tidy, key, ops, Py_None)) < 0) {
            goto out;
        }
        else {
            emptied = 0;
        }
        if (emptied) {
            PyObject *now_ops = PyDict_GetItemWithError(lists, key);
            if (now_ops == NULL && PyErr_Occurred()) {
                goto out;
            }
            if (now_ops == ops && PyDict_DelItem(lists, key) < 0) {
                goto out;
            }
        }
    }
    else if (entry_state(st, single, &single_state) < 0) {
        goto out;
    }
    else if (single_state & ST_FINISHED) {
        PyObject *now_ops = PyDict_GetItemWithError(lists, key);
        if (now_ops == NULL && PyErr_Occurred()) {
            goto out;
        }
        if (now_ops == ops) {
            if (PyDict_DelItem(lists, key) < 0 || entry_left(st, l, single) < 0) {
                goto out;
            }
        }
        else if (discard_result(call_method3((PyObject *)l, N.s_tidy, key, ops, single)) < 0) {
            goto out;
        }
    }
    else if (discard_result(call_method3((PyObject *)l, N.s_tidy, key, ops, single)) < 0) {
        goto out;
    }
    completed = done;
    goto out;
tidy:;
    /* `self._tidy(key, ops, single)`, then what was raised goes on */
    PyObject *exc = fetch_exception();
    PyObject *r = call_method3((PyObject *)l, N.s_tidy, key, ops, none_if_null(single));
    if (r == NULL) {
        Py_DECREF(exc);
    }
    else {
        Py_DECREF(r);
        restore_exception(exc);
    }
out:
    Py_XDECREF(candidates);
    Py_XDECREF(container);
    Py_DECREF(ops);
    Py_DECREF(lists);
    return completed;
}

/* -- the purge ---------------------------------------------------------------------------------- */

/* Take `op` off `key`'s list in `lists` (the lists' dict, held by the caller) in the purge: 1 if
 * an entry was removed, 0 if not, -1 on error. Lookups run the key's, the threshold's and the
 * operation's __hash__ / __eq__: `ops`, `at` and the threshold are held across them. */
static int
purge_entry(NativeState *st, PyObject *lists, PyObject *op, PyObject *key)
{
    PyObject *ops = PyDict_GetItemWithError(lists, key);
    if (ops == NULL) {
        return PyErr_Occurred() ? -1 : 0;
    }
    if (ops == op) {
        return PyDict_DelItem(lists, key) < 0 ? -1 : 1;
    }
    Py_INCREF(ops);
    int result = -1;
    if (PyDict_CheckExact(ops)) {
        int found = PyDict_Contains(ops, op);
        if (found <= 0) {
            result = found;
            goto done;
        }
        int err = PyDict_DelItem(ops, op);
        if (err == 0 && PyDict_GET_SIZE(ops) == 0) {
            err = PyDict_DelItem(lists, key);
        }
        result = err < 0 ? -1 : 1;
        goto done;
    }
    if (!(Threshold_Check(ops) && threshold_ready(st, ops))) {
        result = 0;
        goto done;
    }
    ThresholdObject *t = (ThresholdObject *)ops;
    PyObject *threshold = op_threshold_of(st, op, key);
    if (threshold == NULL) {
        goto done;
    }
    PyObject *at = t->at;
    Py_INCREF(at);
    PyObject *waiting = NULL;
    if (threshold != Py_None) {
        waiting = PyDict_GetItemWithError(at, threshold);
        if (waiting == NULL && PyErr_Occurred()) {
            goto at_done;
        }
    }
    if (waiting == op) { /* (only compared: nothing read through it) */
        if (PyDict_DelItem(at, threshold) < 0) {
            goto at_done;
        }
        if (!threshold_ready(st, ops)) { /* the threshold's code replaced a field: the reference */
            result = discard_result(call_method0(ops, N.s_compact)) < 0 ? -1 : 1;
            goto at_done;
        }
        t->dead++;
        Py_ssize_t run = PyObject_Size(t->run);
        if (run < 0) {
            goto at_done;
        }
        if (t->dead > ((run + PyList_GET_SIZE(t->heap)) >> 1) &&
            discard_result(call_method0(ops, N.s_compact)) < 0) {
            goto at_done;
        }
    }
    else {
        PyObject *args[4] = {ops, op, N.missing, key};
        PyObject *r = PyObject_VectorcallMethod(N.s_pop, args, 4 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                                NULL);
        if (r == NULL) {
            goto at_done;
        }
        int missing = r == N.missing;
        Py_DECREF(r);
        if (missing) {
            result = 0;
            goto at_done;
        }
    }
    int emptied = PyDict_GET_SIZE(at) == 0;
    if (emptied && threshold_ready(st, ops)) {
        emptied = PyDict_GET_SIZE(t->plain) == 0;
    }
    else if (emptied) { /* (a field replaced meanwhile: read as the reference reads it) */
        PyObject *plain = PyObject_GetAttrString(ops, "plain");
        if (plain == NULL) {
            goto at_done;
        }
        emptied = PyObject_Not(plain);
        Py_DECREF(plain);
        if (emptied < 0) {
            goto at_done;
        }
    }
    if (emptied && PyDict_DelItem(lists, key) < 0) {
        goto at_done;
    }
    result = 1;
at_done:
    Py_DECREF(at);
    Py_DECREF(threshold);
done:
    Py_DECREF(ops);
    return result;
}

/* purge(limit): entries removed (limit < 0: all), or -1 on error. */
static Py_ssize_t
lists_purge(NativeState *st, ListsObject *l, Py_ssize_t limit)
{
    PyObject *queue = l->queue;
    Py_INCREF(queue);
    PyObject *batch = PyDict_Keys(queue);
    if (batch == NULL) {
        Py_DECREF(queue);
        return -1;
    }
    Py_ssize_t size = PyList_GET_SIZE(batch);
    if (limit < 0 || size <= limit) {
        PyDict_Clear(queue);
    }
    else {
        /* [queue.popitem()[0] for _ in range(limit)]: the last ones, newest first */
        PyObject *taken = PyList_New(limit);
        if (taken == NULL) {
            Py_DECREF(batch);
            Py_DECREF(queue);
            return -1;
        }
        for (Py_ssize_t i = 0; i < limit; i++) {
            PyObject *op = PyList_GET_ITEM(batch, size - 1 - i);
            PyList_SET_ITEM(taken, i, Py_NewRef(op));
            if (PyDict_DelItem(queue, op) < 0) {
                Py_DECREF(taken);
                Py_DECREF(batch);
                Py_DECREF(queue);
                return -1;
            }
        }
        Py_SETREF(batch, taken);
    }
    Py_DECREF(queue);
    Py_ssize_t purged = 0;
    Py_ssize_t result = -1;
    PyObject *lists = Py_NewRef(l->lists); /* (the reference's local) */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(batch); i++) {
        PyObject *op = PyList_GET_ITEM(batch, i); /* (held by `batch`) */
        PyObject *keys = Op_Check(op) ? Py_XNewRef(((OpObject *)op)->keys)
                                      : PyObject_GetAttrString(op, "_keys");
        if (keys == NULL || !PyTuple_Check(keys)) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_TypeError, "a queued operation has no keys");
            }
            Py_XDECREF(keys);
            Py_DECREF(lists);
            goto done;
        }
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(keys); k++) {
            int removed = purge_entry(st, lists, op, PyTuple_GET_ITEM(keys, k));
            if (removed < 0) {
                Py_DECREF(keys);
                Py_DECREF(lists);
                goto done;
            }
            purged += removed;
        }
        Py_DECREF(keys);
        if (entry_unlisted(st, op) < 0) {
            Py_DECREF(lists);
            goto done;
        }
    }
    Py_DECREF(lists);
    l->purged += purged;
    l->entries -= purged;
    result = purged;
done:
    Py_DECREF(batch);
    return result;
}

/* -- the methods as Python sees them ------------------------------------------------------------ */

#define LISTS_SELF(self)                                                                         \
    if (!CORE_CHECK(self, ListsType) || !lists_ready((ListsObject *)self)) {            \
        return NOT_HANDLED;                                                                      \
    }                                                                                            \
    ListsObject *l = (ListsObject *)self;

static PyObject *
lists_register_native(NativeState *st, PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                      PyObject *kwnames)
{
    LISTS_SELF(self)
    if (nargs != 3 || kwnames != NULL || !Op_Check(args[0]) || !PyTuple_CheckExact(args[1])) {
        return NOT_HANDLED;
    }
    Py_INCREF(self);
    int err = lists_register(st, l, (OpObject *)args[0], args[1], args[2]);
    Py_DECREF(self);
    if (err < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* A trigger's `reached` the C path takes: None, an int, a float that is not NaN. */
static inline int
plain_reached(PyObject *reached)
{
    return reached == Py_None || PyLong_CheckExact(reached) ||
           (PyFloat_CheckExact(reached) && !isnan(PyFloat_AS_DOUBLE(reached)));
}

static PyObject *
lists_trigger_native(NativeState *st, PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                     PyObject *kwnames)
{
    LISTS_SELF(self)
    if (nargs != 3 || kwnames != NULL || !plain_reached(args[1])) {
        return NOT_HANDLED;
    }
    Py_INCREF(self);
    Py_ssize_t completed = lists_trigger(st, l, args[0], args[1], args[2]);
    Py_DECREF(self);
    if (completed < 0) {
        return NULL;
    }
    return PyLong_FromSsize_t(completed);
}

static PyObject *
lists_purge_native(NativeState *st, PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                   PyObject *kwnames)
{
    LISTS_SELF(self)
    Py_ssize_t limit = -1;
    if (nargs != 1 || kwnames != NULL || !budget_arg(args[0], &limit)) {
        return NOT_HANDLED;
    }
    Py_INCREF(self);
    Py_ssize_t purged = lists_purge(st, l, limit);
    Py_DECREF(self);
    if (purged < 0) {
        return NULL;
    }
    return PyLong_FromSsize_t(purged);
}

/* -- PurgeRule: Kafka's rule of when to purge (purgatory/_purge_rule.py) ----------------------- */

static int
rule_traverse(PyObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self)); /* (a heap type: its instances hold it) */
    RuleObject *r = (RuleObject *)self;
    Py_VISIT(r->lists);
    Py_VISIT(r->timer);
    Py_VISIT(r->idle_at);
    return 0;
}

static int
rule_clear(PyObject *self)
{
    RuleObject *r = (RuleObject *)self;
    Py_CLEAR(r->lists);
    Py_CLEAR(r->timer);
    Py_CLEAR(r->idle_at);
    return 0;
}

static void
rule_dealloc(PyObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    rule_clear(self);
    type->tp_free(self);
    Py_DECREF(type); /* (a heap type: its instances hold it) */
}

static PyGetSetDef rule_getset[] = {
    FIELD(RuleObject, timer, "_timer"),
    FIELD(RuleObject, idle_at, "_idle_at"),
    FIELD(RuleObject, lists, "_lists"),
    {NULL},
};

static PyMemberDef rule_members[] = {
    {"interval", Py_T_PYSSIZET, offsetof(RuleObject, interval), 0, NULL},
    {"owed", Py_T_PYSSIZET, offsetof(RuleObject, owed), 0, NULL},
    {"purges", Py_T_PYSSIZET, offsetof(RuleObject, purges), 0, NULL},
    {"trip", Py_T_PYSSIZET, offsetof(RuleObject, trip), 0, NULL},
    {"linger", Py_T_PYSSIZET, offsetof(RuleObject, linger), 0, NULL},
    {"_purging", Py_T_BOOL, offsetof(RuleObject, purging), 0, NULL},
    {"_requested", Py_T_BOOL, offsetof(RuleObject, requested), 0, NULL},
    {"_armed", Py_T_BOOL, offsetof(RuleObject, armed), 0, NULL},
    {"_bounded", Py_T_BOOL, offsetof(RuleObject, bounded), 0, NULL},
    {NULL},
};

static inline int
rule_ready_check(NativeState *st, RuleObject *r)
{
    return r->lists != NULL && CORE_CHECK(r->lists, ListsType) &&
           lists_ready((ListsObject *)r->lists) && r->timer != NULL && r->idle_at != NULL;
}

static inline int
rule_ready(NativeState *st, RuleObject *o)
{
    return o->ready || (o->ready = (char)rule_ready_check(st, o));
}

/* due(): whether the rule says purge and no pass was asked for yet (1 once, 0; -1 on error).
 * The first settlement since the lists were clean schedules the time bound's purge instead,
 * through the reference's own `_schedule` (a pass `linger` ticks after the clock's tick). */
static int
rule_due(NativeState *st, RuleObject *r)
{
    if (r->requested) {
        return 0;
    }
    if (r->owed > r->interval) {
        r->requested = 1;
        return 1;
    }
    if (r->armed) {
        r->armed = 0;
        r->trip = r->interval;
        PyObject *timer = Py_NewRef(r->timer);
        PyObject *now = call_method0(timer, N.s_now);
        PyObject *tick = now == NULL ? NULL : call_method1(timer, N.s_ticks, now);
        Py_XDECREF(now);
        Py_DECREF(timer);
        if (tick == NULL) {
            return -1;
        }
        int err = discard_result(call_method1((PyObject *)r, N.s_schedule, tick));
        Py_DECREF(tick);
        if (err < 0) {
            return -1;
        }
    }
    return 0;
}

static PyObject *
rule_due_native(NativeState *st, PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                PyObject *kwnames)
{
    if (!CORE_CHECK(self, RuleType) || nargs != 0 || kwnames != NULL ||
        !rule_ready(st, (RuleObject *)self)) {
        return NOT_HANDLED;
    }
    Py_INCREF(self);
    int due = rule_due(st, (RuleObject *)self);
    Py_DECREF(self);
    if (due < 0) {
        return NULL;
    }
    return PyBool_FromLong(due);
}
