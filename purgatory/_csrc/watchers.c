/* WatcherLists (purgatory/_watchers.py): every key's watchers, the trigger's re-tries and the
 * purge, their hot methods in C over the reference's own data. A key's watchers are the lone
 * operation, an insertion-ordered dict used as a set, or a ThresholdWatchers (thresholds.c). The
 * rare shapes (a key growing from plain to thresholds, a failure half-way) call the reference's
 * own methods for that step. */

typedef struct {
    CORE_HEAD
    PyObject *lists; /* _lists: dict */
    PyObject *queue; /* list: the purge queue, by identity */
    Py_ssize_t entries, purged;
} ListsObject;

#define LISTS_FIELDS(X) X(lists) X(queue)

/* -- WatcherLists' fields ----------------------------------------------------------------------- */

TYPE_LIFECYCLE(lists, ListsObject, LISTS_FIELDS, NO_FIELDS, NO_WEAKREFS, READY_ONLY)

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
           PyList_CheckExact(l->queue);
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

/* Whether the queued `o` is still on a list (`o._listed`, not 0): 1, 0 (dead), or -1. */
static int
entry_listed(NativeState *st, PyObject *o)
{
    if (Op_Check(o)) {
        return ((OpObject *)o)->listed != 0;
    }
    PyObject *v = PyObject_GetAttrString(o, "_listed");
    if (v == NULL) {
        return -1;
    }
    int truth = PyObject_IsTrue(v);
    Py_DECREF(v);
    return truth;
}

/* The purge queue's last entry taken off (the caller holds `queue`): 0, or -1. */
static inline int
queue_pop_end(PyObject *queue)
{
    Py_ssize_t n = PyList_GET_SIZE(queue);
    return PyList_SetSlice(queue, n - 1, n, NULL);
}

/* The dead entries at the end of the purge queue (held by the caller) taken off: its end stays
 * live (`WatcherLists._gone`). An entry that is not an operation is read by its attribute, code
 * that may change the queue: the end is read again after it. 0, or -1. */
static int
queue_trim(NativeState *st, PyObject *queue)
{
    while (PyList_GET_SIZE(queue) > 0) {
        PyObject *last = Py_NewRef(PyList_GET_ITEM(queue, PyList_GET_SIZE(queue) - 1));
        int live = entry_listed(st, last);
        Py_ssize_t n = PyList_GET_SIZE(queue);
        int err = live == 0 && n > 0 && PyList_GET_ITEM(queue, n - 1) == last
                      ? queue_pop_end(queue)
                      : 0;
        Py_DECREF(last);
        if (live != 0 || err < 0) {
            return live < 0 || err < 0 ? -1 : 0;
        }
    }
    return 0;
}

/* `op` (held by the caller) left its last list (`WatcherLists._gone`): off the purge queue's end
 * if it is the last queued (a trigger's completion: its settle appended it a moment before),
 * with the dead it uncovers, else left there dead and the queue compacted once mostly dead (by
 * the reference's `_gone`, a cold path). 0, or -1 on error. */
static int
lists_gone(NativeState *st, ListsObject *l, PyObject *op)
{
    if (!lists_ready(l)) { /* (a field replaced by the user code a trigger ran) */
        return discard_result(call_method1((PyObject *)l, N.s_gone, op));
    }
    PyObject *queue = l->queue;
    Py_ssize_t n = PyList_GET_SIZE(queue);
    if (n > 0 && PyList_GET_ITEM(queue, n - 1) == op) {
        /* (held: the pop drops the queue's reference to `op`, which the caller holds) */
        Py_INCREF(queue);
        int err = queue_pop_end(queue) < 0 || queue_trim(st, queue) < 0 ? -1 : 0;
        Py_DECREF(queue);
        return err;
    }
    if (n > 2 * l->entries + 16) {
        return discard_result(call_method1((PyObject *)l, N.s_gone, op));
    }
    return 0;
}

/* An entry of `op` left a list: one entry less; off the purge queue once on none. */
static inline int
lists_left(NativeState *st, ListsObject *l, OpObject *op)
{
    l->entries--;
    op->listed--;
    return op->listed ? 0 : lists_gone(st, l, (PyObject *)op);
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


/* `lists.left(op)` for a threshold release given any lists object (thresholds.c). */
static int
release_left(NativeState *st, PyObject *lists, PyObject *op)
{
    if (CORE_CHECK(lists, ListsType) && lists_ready((ListsObject *)lists)) {
        return entry_left(st, (ListsObject *)lists, op);
    }
    return discard_result(PyObject_CallMethod(lists, "left", "O", op));
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

/* `op` at `threshold` on `key`, whose watchers in `lists` were `ops` (NULL: none; both held by
 * the caller): 1 if added, 0 if it already watched the key, -1 on error. */
static int
register_at(NativeState *st, ListsObject *l, PyObject *lists, OpObject *op, PyObject *key,
            PyObject *threshold, PyObject *ops)
{
    if (ops == NULL) {
        return PyDict_SetItem(lists, key, (PyObject *)op) < 0 ? -1 : 1;
    }
    if (ops == (PyObject *)op) {
        return 0;
    }
    if (Threshold_Check(ops) && threshold_ready(ops)) {
        return threshold_add((ThresholdObject *)ops, (PyObject *)op, threshold);
    }
    return register_join_at(st, l, op, key, ops, threshold);
}

/* `op` on `key`'s list, at its threshold from `marks` (`mapping`: marks if a dict): 1 if added,
 * 0 if it already watched the key, -1 on error. The key's watchers first, then its threshold:
 * the reference's order of lookups. */
static int
register_key(NativeState *st, ListsObject *l, PyObject *lists, OpObject *op, PyObject *key,
             PyObject *marks, PyObject *mapping)
{
    PyObject *ops = PyDict_GetItemWithError(lists, key);
    if (ops == NULL && PyErr_Occurred()) {
        return -1;
    }
    Py_XINCREF(ops);
    PyObject *threshold = marks;
    if (mapping != NULL) {
        threshold = PyDict_GetItemWithError(mapping, key);
        if (threshold == NULL) {
            if (!PyErr_Occurred()) {
                PyErr_SetObject(PyExc_KeyError, key);
            }
            Py_XDECREF(ops);
            return -1;
        }
    }
    int added;
    if (threshold == Py_None) {
        added = register_plain(st, l, lists, op, key, ops);
    }
    else {
        Py_INCREF(threshold);
        added = register_at(st, l, lists, op, key, threshold, ops);
        Py_DECREF(threshold);
    }
    Py_XDECREF(ops);
    return added;
}

/* A registration that failed undone: `op` off every key of `keys` (`self._discard`), what was
 * raised raised again (unless the undoing raised what is not an Exception). */
static int
register_undo(NativeState *st, ListsObject *l, OpObject *op, PyObject *keys)
{
    PyObject *exc = fetch_exception();
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(keys); i++) {
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

/* register(op, keys, marks) with `keys` a tuple; -1 with nothing registered on error. */
static int
lists_register(NativeState *st, ListsObject *l, OpObject *op, PyObject *keys, PyObject *marks)
{
    set_field(&op->marks, marks);
    set_field(&op->keys, keys);
    /* counted from zero and added to at the end: a key's code may cancel or trigger a key `op`
     * is on already, which counts it off meanwhile */
    op_mark_listed(op, 0);
    Py_ssize_t listed = PyTuple_GET_SIZE(keys);
    PyObject *mapping = PyDict_CheckExact(marks) ? marks : NULL;
    /* the reference's `lists = self._lists`: held, whatever a key's code assigns meanwhile */
    PyObject *lists = Py_NewRef(l->lists);
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(keys); i++) {
        int added = register_key(st, l, lists, op, PyTuple_GET_ITEM(keys, i), marks, mapping);
        if (added < 0) {
            Py_DECREF(lists);
            return register_undo(st, l, op, keys);
        }
        listed -= !added;
    }
    Py_DECREF(lists);
    op_mark_listed(op, op->listed + listed);
    l->entries += listed;
    return 0;
}

/* -- the trigger -------------------------------------------------------------------------------- */

/* Kinds of `drop` in the reference's trigger. */
#define DROP_DICT 0      /* ops.pop / plain.pop: a dict */
#define DROP_THRESHOLD 1 /* partial(ops.pop, key=key): ThresholdWatchers.pop */
#define DROP_NOTHING 2   /* a lone watcher: its entry goes after the loop */

#define TRIGGER_SMALL 8

/* What a trigger re-tries: the candidates (`n` strong references in `items`, the `small` array
 * or a PyMem one: no Python list to allocate per trigger), the container they are dropped from
 * and how (`kind`), the lone watcher (`single`, borrowed: the key's `ops` itself, or NULL). */
typedef struct {
    PyObject *key, *ops, *container, *single;
    PyObject **items;
    Py_ssize_t n;
    PyObject *small[TRIGGER_SMALL];
    int kind;
    Py_ssize_t done;
} Trigger;

/* Room for `n` candidates: 0, or -1. */
static int
trigger_room(Trigger *tr, Py_ssize_t n)
{
    tr->items = n <= TRIGGER_SMALL ? tr->small : PyMem_New(PyObject *, n);
    if (tr->items == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* The candidates: the keys of `tr->container` (an exact dict: iterating it runs no code), or
 * what iterating it gives (a ThresholdWatchers' __iter__, the reference's). 1, or -1. */
static int
trigger_snapshot(Trigger *tr)
{
    if (PyDict_CheckExact(tr->container)) {
        if (trigger_room(tr, PyDict_GET_SIZE(tr->container)) < 0) {
            return -1;
        }
        Py_ssize_t pos = 0;
        PyObject *op, *value;
        while (PyDict_Next(tr->container, &pos, &op, &value)) {
            tr->items[tr->n++] = Py_NewRef(op);
        }
        return 1;
    }
    PyObject *list = PySequence_List(tr->container);
    if (list == NULL || trigger_room(tr, PyList_GET_SIZE(list)) < 0) {
        Py_XDECREF(list);
        return -1;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(list); i++) {
        tr->items[tr->n++] = Py_NewRef(PyList_GET_ITEM(list, i));
    }
    Py_DECREF(list);
    return 1;
}

/* The candidates released (once the trigger no longer reads them). */
static void
trigger_forget(Trigger *tr)
{
    PyObject **items = tr->items;
    Py_ssize_t n = tr->n;
    tr->items = NULL;
    tr->n = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_DECREF(items[i]);
    }
    if (items != tr->small) {
        PyMem_Free(items);
    }
}

/* `drop(op, _NOTHING_TO_POP) is None`: 1 if `op` was taken off, 0 if not, -1 on error. */
static int
trigger_drop(NativeState *st, Trigger *tr, PyObject *op)
{
    if (tr->kind == DROP_DICT) {
        PyObject *v;
        int found = dict_pop(tr->container, op, &v);
        if (found <= 0) {
            return found;
        }
        int is_none = v == Py_None;
        Py_DECREF(v);
        return is_none;
    }
    if (tr->kind == DROP_THRESHOLD && threshold_ready(tr->container)) {
        return threshold_pop(st, (ThresholdObject *)tr->container, op, tr->key);
    }
    if (tr->kind == DROP_THRESHOLD) { /* (a field replaced meanwhile: the method) */
        PyObject *args[4] = {tr->container, op, N.nothing_to_pop, tr->key};
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

/* A lone watcher `ops` at a threshold: 1 if `reached` released it (made plain on the key), 0 if
 * it waits on, or -1. */
static int
trigger_lone(NativeState *st, PyObject *ops, PyObject *key, PyObject *reached)
{
    PyObject *threshold = op_threshold_of(st, ops, key);
    if (threshold == NULL) {
        return -1;
    }
    if (threshold == Py_None) {
        Py_DECREF(threshold);
        return 1;
    }
    int reached_it = compare_values(threshold, reached, Py_LE);
    Py_DECREF(threshold);
    if (reached_it <= 0) {
        return reached_it;
    }
    return discard_result(call2(N.release_lone, ops, key)) < 0 ? -1 : 1;
}

/* The candidates of a trigger of `tr->ops` (held): 1, or 0 when nothing is re-tried, or -1. */
static int
trigger_candidates(NativeState *st, ListsObject *l, Trigger *tr, PyObject *reached)
{
    PyObject *ops = tr->ops;
    if (PyDict_CheckExact(ops)) {
        tr->container = Py_NewRef(ops);
        tr->kind = DROP_DICT;
    }
    else if (Threshold_Check(ops) && threshold_ready(ops)) {
        if (reached == Py_None) {
            tr->container = Py_NewRef(ops); /* (its __iter__: the plain, then by threshold) */
            tr->kind = DROP_THRESHOLD;
        }
        else {
            if (threshold_release(st, (ThresholdObject *)ops, reached, (PyObject *)l) < 0) {
                return -1;
            }
            tr->container = Py_NewRef(((ThresholdObject *)ops)->plain);
            tr->kind = DROP_DICT;
        }
    }
    else {
        if (reached != Py_None && Op_Check(ops)) {
            int released = trigger_lone(st, ops, tr->key, reached);
            if (released <= 0) {
                return released;
            }
        }
        tr->single = ops;
        tr->kind = DROP_NOTHING;
        tr->items = tr->small;
        tr->items[tr->n++] = Py_NewRef(ops);
        return 1;
    }
    return trigger_snapshot(tr);
}

/* A finished `item` found on the list: dropped from it, counted off the lists. */
static int
trigger_finished(NativeState *st, ListsObject *l, Trigger *tr, PyObject *item)
{
    int dropped = trigger_drop(st, tr, item);
    return dropped < 0 || (dropped && entry_left(st, l, item) < 0) ? -1 : 0;
}

/* An `item` whose try_complete raised `exc` (taken): reported, unless an interrupt. */
static int
trigger_raised(NativeState *st, Trigger *tr, PyObject *item, PyObject *exc)
{
    if (is_interrupt(exc)) {
        restore_exception(exc);
        return -1;
    }
    PyObject *r = call3(N.report_attempt, item, tr->key, exc);
    Py_DECREF(exc);
    return discard_result(r);
}

/* `item`'s try_complete, and what its state says after it. */
static int
trigger_try(NativeState *st, ListsObject *l, Trigger *tr, PyObject *item)
{
    int state;
    PyObject *claimed = call_op_method(item, M_TRY_COMPLETE);
    if (claimed == NULL) {
        return trigger_raised(st, tr, item, fetch_exception());
    }
    if (entry_state(st, item, &state) < 0) {
        Py_DECREF(claimed);
        return -1;
    }
    if (state & ST_FINISHED) {
        Py_DECREF(claimed);
        if (trigger_finished(st, l, tr, item) < 0) {
            return -1;
        }
        tr->done += (state & ST_EXPIRED_NOW) == ST_DONE;
        return 0;
    }
    int truth = PyObject_IsTrue(claimed);
    PyObject *r = truth > 0 ? call2(N.report_false_claim, item, claimed) : NULL;
    Py_DECREF(claimed);
    if (truth < 0 || (truth > 0 && r == NULL)) {
        return -1;
    }
    Py_XDECREF(r);
    return 0;
}

/* One candidate re-tried (held by the caller): 0, or -1 on an error that ends the trigger. */
static int
trigger_one(NativeState *st, ListsObject *l, Trigger *tr, PyObject *item, PyObject *attempt)
{
    int state;
    if (entry_state(st, item, &state) < 0) {
        return -1;
    }
    if (!state) {
        return trigger_try(st, l, tr, item);
    }
    if (state & ST_FINISHED) {
        return trigger_finished(st, l, tr, item);
    }
    return discard_result(call1(attempt, item));
}

/* Whether the watchers `ops` (not a lone one) are none now: 1, 0, or -1. */
static int
trigger_emptied(NativeState *st, ListsObject *l, Trigger *tr)
{
    PyObject *ops = tr->ops;
    if (PyDict_CheckExact(ops)) {
        return PyDict_GET_SIZE(ops) == 0;
    }
    if (Threshold_Check(ops) && threshold_ready(ops)) {
        ThresholdObject *t = (ThresholdObject *)ops;
        return PyDict_GET_SIZE(t->plain) == 0 && PyDict_GET_SIZE(t->at) == 0;
    }
    return discard_result(call_method3((PyObject *)l, N.s_tidy, tr->key, ops, Py_None)) < 0 ? -1
                                                                                            : 0;
}

/* `del lists[key]` if the key's watchers are still `tr->ops`: 1 if deleted, 0, or -1. */
static int
trigger_del_key(PyObject *lists, Trigger *tr)
{
    PyObject *now_ops = PyDict_GetItemWithError(lists, tr->key);
    if (now_ops == NULL && PyErr_Occurred()) {
        return -1;
    }
    if (now_ops != tr->ops) {
        return 0;
    }
    return PyDict_DelItem(lists, tr->key) < 0 ? -1 : 1;
}

/* The end of a trigger (the callbacks ran: `ops` is read again as it is now): an emptied list,
 * or a finished lone watcher, dropped. */
static int
trigger_end(NativeState *st, ListsObject *l, PyObject *lists, Trigger *tr)
{
    if (tr->single == NULL) {
        int emptied = trigger_emptied(st, l, tr);
        return emptied <= 0 ? emptied : (trigger_del_key(lists, tr) < 0 ? -1 : 0);
    }
    int state;
    if (entry_state(st, tr->single, &state) < 0) {
        return -1;
    }
    if (state & ST_FINISHED) {
        int deleted = trigger_del_key(lists, tr);
        if (deleted != 0) {
            return deleted < 0 || entry_left(st, l, tr->single) < 0 ? -1 : 0;
        }
    }
    return discard_result(call_method3((PyObject *)l, N.s_tidy, tr->key, tr->ops, tr->single));
}

/* After an error in the loop: `self._tidy(key, ops, single)`, then what was raised goes on. */
static void
trigger_tidy(NativeState *st, ListsObject *l, Trigger *tr)
{
    PyObject *exc = fetch_exception();
    PyObject *r = call_method3((PyObject *)l, N.s_tidy, tr->key, tr->ops,
                               none_if_null(tr->single));
    if (r == NULL) {
        Py_DECREF(exc);
    }
    else {
        Py_DECREF(r);
        restore_exception(exc);
    }
}

/* The loop: every candidate re-tried; 0, or -1 (tidied). */
static int
trigger_loop(NativeState *st, ListsObject *l, Trigger *tr, PyObject *attempt)
{
    for (Py_ssize_t i = 0; i < tr->n; i++) {
        PyObject *item = Py_NewRef(tr->items[i]);
        int err = trigger_one(st, l, tr, item, attempt);
        Py_DECREF(item);
        if (err < 0) {
            trigger_tidy(st, l, tr);
            return -1;
        }
    }
    return 0;
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
    Trigger tr = {.key = key, .ops = Py_NewRef(ops)};
    Py_ssize_t completed = -1;
    int go = trigger_candidates(st, l, &tr, reached);
    if (go == 0) {
        completed = 0;
    }
    else if (go > 0 && trigger_loop(st, l, &tr, attempt) == 0 &&
             trigger_end(st, l, lists, &tr) == 0) {
        completed = tr.done;
    }
    trigger_forget(&tr);
    Py_XDECREF(tr.container);
    Py_DECREF(tr.ops);
    Py_DECREF(lists);
    return completed;
}

/* -- the purge ---------------------------------------------------------------------------------- */

/* `op` off a key's ThresholdWatchers `t` in the purge (held): the reference's inline common case
 * (alone at its threshold: the entry deleted, one dead threshold more), else `t.pop`. 1 if an
 * entry was removed, 0 if not, -1 on error; *at_then the `at` it looked in (a new reference). */
static int
purge_at(NativeState *st, ThresholdObject *t, PyObject *op, PyObject *key, PyObject **at_then)
{
    PyObject *threshold = op_threshold_of(st, op, key);
    if (threshold == NULL) {
        return -1;
    }
    PyObject *at = *at_then = threshold_dict(t, t->at);
    if (at == NULL) {
        Py_DECREF(threshold);
        return -1;
    }
    PyObject *waiting = NULL;
    if (threshold != Py_None) {
        waiting = PyDict_GetItemWithError(at, threshold);
        if (waiting == NULL && PyErr_Occurred()) {
            Py_DECREF(threshold);
            return -1;
        }
    }
    int result;
    if (waiting == op) { /* (only compared: nothing read through it) */
        result = PyDict_DelItem(at, threshold) < 0 || threshold_dead(t) < 0 ? -1 : 1;
    }
    else {
        result = threshold_pop(st, t, op, key);
    }
    Py_DECREF(threshold);
    return result;
}

/* `op` off `key`'s ThresholdWatchers `ops` (held), the key dropped once it has none. */
static int
purge_threshold(NativeState *st, PyObject *lists, PyObject *ops, PyObject *op, PyObject *key)
{
    PyObject *at = NULL;
    int removed = purge_at(st, (ThresholdObject *)ops, op, key, &at);
    /* `not (ops.plain or at)`: the plain as it is now, the `at` looked in */
    PyObject *plain = ((ThresholdObject *)ops)->plain;
    if (removed > 0 && PyDict_GET_SIZE(at) == 0 && (plain == NULL || PyDict_GET_SIZE(plain) == 0) &&
        PyDict_DelItem(lists, key) < 0) {
        removed = -1;
    }
    Py_XDECREF(at);
    return removed;
}

/* Take `op` off `key`'s list in `lists` (the lists' dict, held by the caller) in the purge: 1 if
 * an entry was removed, 0 if not, -1 on error. Lookups run the key's, the threshold's and the
 * operation's __hash__ / __eq__: what they read is held across them. */
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
    int result = 0;
    if (PyDict_CheckExact(ops)) {
        result = PyDict_Contains(ops, op);
        if (result > 0) {
            int err = PyDict_DelItem(ops, op);
            if (err == 0 && PyDict_GET_SIZE(ops) == 0) {
                err = PyDict_DelItem(lists, key);
            }
            result = err < 0 ? -1 : 1;
        }
    }
    else if (Threshold_Check(ops) && threshold_ready(ops)) {
        result = purge_threshold(st, lists, ops, op, key);
    }
    Py_DECREF(ops);
    return result;
}

/* All the operations of `queue` (an exact list, held by the caller), taken out for a purge. The
 * batch's list is made first (it may collect, and a collection run code that settles into the
 * queue), the queue read after it: as the reference's copy, what it took is deleted by its
 * count, and what was added meanwhile stays for the next purge. */
static PyObject *
purge_all(PyObject *queue)
{
    Py_ssize_t n;
    PyObject *batch;
    do { /* (made again if the queue shrank meanwhile: a compaction) */
        n = PyList_GET_SIZE(queue);
        batch = PyList_New(n);
        if (batch == NULL) {
            return NULL;
        }
        if (PyList_GET_SIZE(queue) >= n) {
            break;
        }
        Py_DECREF(batch);
    } while (1);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyList_SET_ITEM(batch, i, Py_NewRef(PyList_GET_ITEM(queue, i)));
    }
    /* (the queue's references to them dropped: `batch` holds them all, none is freed) */
    if (PyList_SetSlice(queue, 0, n, NULL) < 0) {
        Py_DECREF(batch);
        return NULL;
    }
    return batch;
}

/* The newest `limit` operations of `queue` still listed, taken out for a purge slice, newest
 * first; the dead ones met on the way, and those its end uncovers, dropped (the reference's
 * loop of pops). */
static PyObject *
purge_slice(NativeState *st, PyObject *queue, Py_ssize_t limit)
{
    PyObject *batch = PyList_New(0);
    while (batch != NULL && PyList_GET_SIZE(batch) < limit && PyList_GET_SIZE(queue) > 0) {
        PyObject *op = Py_NewRef(PyList_GET_ITEM(queue, PyList_GET_SIZE(queue) - 1));
        int live = queue_pop_end(queue) < 0 ? -1 : entry_listed(st, op);
        if (live < 0 || (live > 0 && PyList_Append(batch, op) < 0)) {
            Py_CLEAR(batch);
        }
        Py_DECREF(op);
    }
    if (batch != NULL && queue_trim(st, queue) < 0) {
        Py_CLEAR(batch);
    }
    return batch;
}

/* The operations a purge visits, taken out of `queue` (held by the caller): all of them, or a
 * slice of `limit`. */
static PyObject *
purge_batch(NativeState *st, PyObject *queue, Py_ssize_t limit)
{
    if (limit < 0 || PyList_GET_SIZE(queue) <= limit) {
        return purge_all(queue);
    }
    return purge_slice(st, queue, limit);
}

/* One queued operation (held by the caller) off the lists of its keys: entries removed, or -1.
 * A dead one (it left every list once queued) is skipped. */
static Py_ssize_t
purge_op(NativeState *st, PyObject *lists, PyObject *op)
{
    int live = entry_listed(st, op);
    if (live <= 0) {
        return live;
    }
    PyObject *keys = Op_Check(op) ? Py_XNewRef(((OpObject *)op)->keys)
                                  : PyObject_GetAttrString(op, "_keys");
    if (keys == NULL || !PyTuple_Check(keys)) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "a queued operation has no keys");
        }
        Py_XDECREF(keys);
        return -1;
    }
    Py_ssize_t purged = 0;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(keys); k++) {
        int removed = purge_entry(st, lists, op, PyTuple_GET_ITEM(keys, k));
        if (removed < 0) {
            Py_DECREF(keys);
            return -1;
        }
        purged += removed;
    }
    Py_DECREF(keys);
    return entry_unlisted(st, op) < 0 ? -1 : purged;
}

/* purge(limit): entries removed (limit < 0: all), or -1 on error. */
static Py_ssize_t
lists_purge(NativeState *st, ListsObject *l, Py_ssize_t limit)
{
    PyObject *queue = Py_NewRef(l->queue);
    PyObject *batch = purge_batch(st, queue, limit);
    Py_DECREF(queue);
    if (batch == NULL) {
        return -1;
    }
    Py_ssize_t purged = 0;
    PyObject *lists = Py_NewRef(l->lists); /* (the reference's local) */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(batch) && purged >= 0; i++) {
        Py_ssize_t removed = purge_op(st, lists, PyList_GET_ITEM(batch, i)); /* (held by `batch`) */
        purged = removed < 0 ? -1 : purged + removed;
    }
    Py_DECREF(lists);
    Py_DECREF(batch);
    if (purged >= 0) {
        l->purged += purged;
        l->entries -= purged;
    }
    return purged;
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
