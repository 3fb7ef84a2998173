/* The watcher lists' hot methods (purgatory/_watchers.py: register, trigger, purge) over the
 * reference's own data: a key's watchers are the lone operation, an insertion-ordered dict used
 * as a set, or a ThresholdWatchers (purgatory/_thresholds.py, whose five fields are C fields
 * here). The rare shapes (a key growing from plain to thresholds, a list of operations under
 * one threshold, a failure half-way) call the reference's own methods for that step. */

/* -- ThresholdWatchers' fields ------------------------------------------------------------------ */

static int
threshold_traverse(PyObject *self, visitproc visit, void *arg)
{
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
    PyObject_GC_UnTrack(self);
    threshold_clear(self);
    Py_TYPE(self)->tp_free(self);
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
threshold_ready_check(ThresholdObject *t)
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
threshold_ready(PyObject *o)
{
    ThresholdObject *t = (ThresholdObject *)o;
    return t->ready || (t->ready = (char)threshold_ready_check(t));
}


/* -- WatcherLists' fields ----------------------------------------------------------------------- */

static int
lists_traverse(PyObject *self, visitproc visit, void *arg)
{
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
    PyObject_GC_UnTrack(self);
    lists_clear(self);
    Py_TYPE(self)->tp_free(self);
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
lists_left(ListsObject *l, OpObject *op)
{
    l->entries--;
    op->listed--;
    if (!op->listed) {
        if (dict_discard(l->queue, (PyObject *)op) < 0) {
            return -1;
        }
    }
    return 0;
}

/* -- registration ------------------------------------------------------------------------------- */

/* `op` as a plain watcher of `key` (the plain path of register): 1 if added, 0 if it already
 * watched the key, -1 on error. */
static int
register_plain(ListsObject *l, OpObject *op, PyObject *key)
{
    PyObject *ops = PyDict_GetItemWithError(l->lists, key);
    if (ops == NULL) {
        if (PyErr_Occurred()) {
            return -1;
        }
        return PyDict_SetItem(l->lists, key, (PyObject *)op) < 0 ? -1 : 1;
    }
    if (PyDict_CheckExact(ops)) {
        Py_INCREF(ops);
        int found = PyDict_Contains(ops, (PyObject *)op);
        int r = found < 0 ? -1 : found ? 0 : (PyDict_SetItem(ops, (PyObject *)op, Py_None) < 0 ? -1 : 1);
        Py_DECREF(ops);
        return r;
    }
    if (ops == (PyObject *)op) {
        return 0;
    }
    if (Op_Check(ops)) {
        /* a lone watcher: plain too (no marks, or none for this key) makes an ordered set */
        PyObject *marks = ((OpObject *)ops)->marks;
        int lone_plain = marks == NULL || marks == Py_None;
        if (!lone_plain && PyDict_CheckExact(marks)) {
            PyObject *mark = PyDict_GetItemWithError(marks, key);
            if (mark == NULL && PyErr_Occurred()) {
                return -1;
            }
            lone_plain = mark == NULL || mark == Py_None;
        }
        if (lone_plain) {
            PyObject *set = PyDict_New();
            if (set == NULL) {
                return -1;
            }
            if (PyDict_SetItem(set, ops, Py_None) < 0 ||
                PyDict_SetItem(set, (PyObject *)op, Py_None) < 0 ||
                PyDict_SetItem(l->lists, key, set) < 0) {
                Py_DECREF(set);
                return -1;
            }
            Py_DECREF(set);
            return 1;
        }
    }
    Py_INCREF(ops);
    PyObject *r = call_method3((PyObject *)l, N.s_join_plain, key, (PyObject *)op, ops);
    Py_DECREF(ops);
    if (r == NULL) {
        return -1;
    }
    int added = PyObject_IsTrue(r);
    Py_DECREF(r);
    return added;
}

/* The fallback of register_at for a key whose watchers are a lone operation or an ordered set:
 * `self._join_at(key, op, ops, threshold)`. */
static int
register_join_at(ListsObject *l, OpObject *op, PyObject *key, PyObject *ops, PyObject *threshold)
{
    PyObject *args[5] = {(PyObject *)l, key, (PyObject *)op, ops, threshold};
    return discard_result(PyObject_VectorcallMethod(
               N.s_join_at, args, 5 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL)) < 0
               ? -1
               : 1;
}

/* `op` at `threshold` on `key`: 1 if added, 0 if it already watched the key, -1 on error. */
static int
register_at(ListsObject *l, OpObject *op, PyObject *key, PyObject *threshold)
{
    PyObject *ops = PyDict_GetItemWithError(l->lists, key);
    if (ops == NULL) {
        if (PyErr_Occurred()) {
            return -1;
        }
        return PyDict_SetItem(l->lists, key, (PyObject *)op) < 0 ? -1 : 1;
    }
    if (ops == (PyObject *)op) {
        return 0;
    }
    Py_INCREF(ops);
    int result = -1;
    if (Threshold_Check(ops) && threshold_ready(ops)) {
        ThresholdObject *t = (ThresholdObject *)ops;
        PyObject *at = t->at;
        Py_INCREF(at);
        PyObject *waiting = PyDict_GetItemWithError(at, threshold);
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
            Py_INCREF(waiting);
            int found = PySequence_Contains(waiting, (PyObject *)op);
            result = found < 0 ? -1 : found ? 0 : (PyList_Append(waiting, (PyObject *)op) < 0 ? -1 : 1);
            Py_DECREF(waiting);
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
        Py_DECREF(at);
    }
    else {
        result = register_join_at(l, op, key, ops, threshold);
    }
    Py_DECREF(ops);
    return result;
}

/* register(op, keys, marks) with `keys` a tuple; -1 with nothing registered on error. */
static int
lists_register(ListsObject *l, OpObject *op, PyObject *keys, PyObject *marks)
{
    set_field(&op->marks, marks);
    set_field(&op->keys, keys);
    Py_ssize_t n = PyTuple_GET_SIZE(keys);
    Py_ssize_t listed = n;
    PyObject *mapping = PyDict_CheckExact(marks) ? marks : NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = PyTuple_GET_ITEM(keys, i);
        int added;
        if (marks == Py_None) {
            added = register_plain(l, op, key);
        }
        else {
            PyObject *threshold = marks;
            if (mapping != NULL) {
                threshold = PyDict_GetItemWithError(mapping, key);
                if (threshold == NULL) {
                    if (!PyErr_Occurred()) {
                        PyErr_SetObject(PyExc_KeyError, key);
                    }
                    goto fail;
                }
            }
            if (threshold == Py_None) {
                added = register_plain(l, op, key);
            }
            else {
                Py_INCREF(threshold);
                added = register_at(l, op, key, threshold);
                Py_DECREF(threshold);
            }
        }
        if (added < 0) {
            goto fail;
        }
        if (added == 0) {
            listed--;
        }
    }
    op_mark_listed(op, listed);
    l->entries += listed;
    return 0;
fail:;
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
trigger_drop(int kind, PyObject *container, PyObject *op, PyObject *key)
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

/* Release every threshold <= reached of `t` into its plain watchers (finished ones leave). */
static int
trigger_release(ListsObject *l, ThresholdObject *t, PyObject *reached)
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
        {
            if (PyList_CheckExact(waiting)) { /* several under one threshold */
                for (Py_ssize_t i = 0; i < PyList_GET_SIZE(waiting) && err == 0; i++) {
                    PyObject *op = PyList_GET_ITEM(waiting, i);
                    if (Op_Check(op) && ((OpObject *)op)->state & ST_FINISHED) {
                        Py_INCREF(op);
                        err = lists_left(l, (OpObject *)op);
                        Py_DECREF(op);
                    }
                    else {
                        err = PyDict_SetItem(plain, op, Py_None);
                    }
                }
            }
            else if (Op_Check(waiting) && ((OpObject *)waiting)->state & ST_FINISHED) {
                err = lists_left(l, (OpObject *)waiting);
            }
            else {
                err = PyDict_SetItem(plain, waiting, Py_None);
            }
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

/* The threshold of `op` on `key` (a new reference; None: plain), from its marks. */
static PyObject *
op_threshold_of(OpObject *op, PyObject *key)
{
    PyObject *marks = op->marks;
    if (marks == NULL || marks == Py_None) {
        Py_RETURN_NONE;
    }
    if (PyDict_CheckExact(marks)) {
        PyObject *t = PyDict_GetItemWithError(marks, key);
        if (t == NULL) {
            if (PyErr_Occurred()) {
                return NULL;
            }
            Py_RETURN_NONE;
        }
        return Py_NewRef(t);
    }
    return Py_NewRef(marks);
}

/* trigger(key, reached, attempt): how many completed, or -1 on error. */
static Py_ssize_t
lists_trigger(ListsObject *l, PyObject *key, PyObject *reached, PyObject *attempt)
{
    PyObject *ops = PyDict_GetItemWithError(l->lists, key);
    if (ops == NULL) {
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
    else if (Threshold_Check(ops) && threshold_ready(ops)) {
        ThresholdObject *t = (ThresholdObject *)ops;
        if (reached == Py_None) {
            candidates = PySequence_List(ops);
            container = Py_NewRef(ops);
            kind = DROP_THRESHOLD;
        }
        else {
            if (trigger_release(l, t, reached) < 0) {
                goto out;
            }
            container = Py_NewRef(t->plain);
            candidates = PySequence_List(container);
            kind = DROP_DICT;
        }
    }
    else {
        if (reached != Py_None && Op_Check(ops)) {
            PyObject *threshold = op_threshold_of((OpObject *)ops, key);
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
        OpObject *op = (OpObject *)item;
        int state = op->state;
        int dropped;
        Py_INCREF(item);
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
            state = op->state;
            if (state & ST_FINISHED) {
                Py_DECREF(claimed);
                dropped = trigger_drop(kind, container, item, key);
                if (dropped < 0 || (dropped && lists_left(l, op) < 0)) {
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
            dropped = trigger_drop(kind, container, item, key);
            if (dropped < 0 || (dropped && lists_left(l, op) < 0)) {
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
    /* the end of the trigger */
    if (single == NULL) {
        int emptied;
        if (kind == DROP_DICT && PyDict_CheckExact(ops)) {
            emptied = PyDict_GET_SIZE(ops) == 0;
        }
        else {
            ThresholdObject *t = (ThresholdObject *)ops;
            emptied = PyDict_GET_SIZE(t->plain) == 0 && PyDict_GET_SIZE(t->at) == 0;
        }
        if (emptied) {
            PyObject *now_ops = PyDict_GetItemWithError(l->lists, key);
            if (now_ops == NULL && PyErr_Occurred()) {
                goto out;
            }
            if (now_ops == ops && PyDict_DelItem(l->lists, key) < 0) {
                goto out;
            }
        }
    }
    else if (((OpObject *)single)->state & ST_FINISHED) {
        PyObject *now_ops = PyDict_GetItemWithError(l->lists, key);
        if (now_ops == NULL && PyErr_Occurred()) {
            goto out;
        }
        if (now_ops == ops) {
            if (PyDict_DelItem(l->lists, key) < 0 || lists_left(l, (OpObject *)single) < 0) {
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
    return completed;
}

/* -- the purge ---------------------------------------------------------------------------------- */

/* Take `op` off `key`'s list in the purge: 1 if an entry was removed, 0 if not, -1 on error. */
static int
purge_entry(ListsObject *l, OpObject *op, PyObject *key)
{
    PyObject *lists = l->lists;
    PyObject *ops = PyDict_GetItemWithError(lists, key);
    if (ops == NULL) {
        return PyErr_Occurred() ? -1 : 0;
    }
    if (ops == (PyObject *)op) {
        return PyDict_DelItem(lists, key) < 0 ? -1 : 1;
    }
    if (PyDict_CheckExact(ops)) {
        int found = PyDict_Contains(ops, (PyObject *)op);
        if (found <= 0) {
            return found;
        }
        Py_INCREF(ops);
        int err = PyDict_DelItem(ops, (PyObject *)op);
        if (err == 0 && PyDict_GET_SIZE(ops) == 0) {
            err = PyDict_DelItem(lists, key);
        }
        Py_DECREF(ops);
        return err < 0 ? -1 : 1;
    }
    if (!(Threshold_Check(ops) && threshold_ready(ops))) {
        return 0;
    }
    Py_INCREF(ops);
    int result = -1;
    ThresholdObject *t = (ThresholdObject *)ops;
    PyObject *threshold = op_threshold_of(op, key);
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
    if (waiting == (PyObject *)op) {
        if (PyDict_DelItem(at, threshold) < 0) {
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
        PyObject *args[4] = {ops, (PyObject *)op, N.missing, key};
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
    if (PyDict_GET_SIZE(t->plain) == 0 && PyDict_GET_SIZE(t->at) == 0 &&
        PyDict_DelItem(lists, key) < 0) {
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
lists_purge(ListsObject *l, Py_ssize_t limit)
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
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(batch); i++) {
        OpObject *op = (OpObject *)PyList_GET_ITEM(batch, i);
        PyObject *keys = op->keys;
        if (keys == NULL || !PyTuple_Check(keys)) {
            PyErr_SetString(PyExc_TypeError, "a queued operation has no keys");
            goto done;
        }
        Py_INCREF(keys);
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(keys); k++) {
            int removed = purge_entry(l, op, PyTuple_GET_ITEM(keys, k));
            if (removed < 0) {
                Py_DECREF(keys);
                goto done;
            }
            purged += removed;
        }
        Py_DECREF(keys);
        op_mark_listed(op, 0);
    }
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
lists_register_native(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                      PyObject *kwnames)
{
    LISTS_SELF(self)
    if (nargs != 3 || kwnames != NULL || !Op_Check(args[0]) || !PyTuple_CheckExact(args[1])) {
        return NOT_HANDLED;
    }
    Py_INCREF(self);
    int err = lists_register(l, (OpObject *)args[0], args[1], args[2]);
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
lists_trigger_native(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                     PyObject *kwnames)
{
    LISTS_SELF(self)
    if (nargs != 3 || kwnames != NULL || !plain_reached(args[1])) {
        return NOT_HANDLED;
    }
    Py_INCREF(self);
    Py_ssize_t completed = lists_trigger(l, args[0], args[1], args[2]);
    Py_DECREF(self);
    if (completed < 0) {
        return NULL;
    }
    return PyLong_FromSsize_t(completed);
}

static PyObject *
lists_purge_native(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    LISTS_SELF(self)
    Py_ssize_t limit = -1;
    if (nargs != 1 || kwnames != NULL || !budget_arg(args[0], &limit)) {
        return NOT_HANDLED;
    }
    Py_INCREF(self);
    Py_ssize_t purged = lists_purge(l, limit);
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
    PyObject_GC_UnTrack(self);
    rule_clear(self);
    Py_TYPE(self)->tp_free(self);
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
rule_ready_check(RuleObject *r)
{
    return r->lists != NULL && CORE_CHECK(r->lists, ListsType) &&
           lists_ready((ListsObject *)r->lists) && r->timer != NULL && r->idle_at != NULL;
}

static inline int
rule_ready(RuleObject *o)
{
    return o->ready || (o->ready = (char)rule_ready_check(o));
}

/* due(): whether the rule says purge and no pass was asked for yet (1 once, 0; -1 on error).
 * The first settlement since the lists were clean schedules the time bound's purge instead,
 * through the reference's own `_schedule` (a pass `linger` ticks after the clock's tick). */
static int
rule_due(RuleObject *r)
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
rule_due_native(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (!CORE_CHECK(self, RuleType) || nargs != 0 || kwnames != NULL ||
        !rule_ready((RuleObject *)self)) {
        return NOT_HANDLED;
    }
    Py_INCREF(self);
    int due = rule_due((RuleObject *)self);
    Py_DECREF(self);
    if (due < 0) {
        return NULL;
    }
    return PyBool_FromLong(due);
}
