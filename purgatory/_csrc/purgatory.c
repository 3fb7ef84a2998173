/* The facade's hot methods (purgatory/_purgatory.py: try_complete_else_watch,
 * check_and_complete, _settled, _after_pass). The watch takes the common case (an operation of a
 * class met before, keys as a tuple or through the reference's own `_split_keys`, a plain or
 * numeric threshold) in C, and hands anything else to the reference before it has done anything;
 * past the point where the reference could take over (the keys were consumed), its errors are
 * built by the reference's own helpers, so the messages are the same. */

/* Its fields' table is PURGATORY_FIELDS (native.h), beside the struct. */
TYPE_LIFECYCLE(purgatory, PurgatoryObject, PURGATORY_FIELDS, NO_FIELDS, HAS_WEAKREFS,
               READY_ONLY)

static PyObject *
purgatory_get_weakref(PyObject *self, void *closure)
{
    PyObject *list = ((PurgatoryObject *)self)->weakreflist;
    return Py_NewRef(list == NULL ? Py_None : list);
}

static PyGetSetDef purgatory_getset[] = {
    FIELD(PurgatoryObject, attempt, "_attempt"),
    FIELD(PurgatoryObject, attempts, "_attempts"),
    FIELD(PurgatoryObject, binding, "_binding"),
    FIELD(PurgatoryObject, lists, "_lists"),
    FIELD(PurgatoryObject, max_pending, "_max_pending"),
    FIELD(PurgatoryObject, name, "_name"),
    FIELD(PurgatoryObject, purge_queue, "_purge_queue"),
    FIELD(PurgatoryObject, rule, "_rule"),
    FIELD(PurgatoryObject, sink, "_sink"),
    FIELD(PurgatoryObject, sync_types, "_sync_types"),
    FIELD(PurgatoryObject, time_op, "_time_op"),
    FIELD(PurgatoryObject, timer, "_timer"),
    {"__weakref__", purgatory_get_weakref, NULL, "list of weak references to the object", NULL},
    {NULL},
};

static PyMemberDef purgatory_members[] = {
    {"__weaklistoffset__", Py_T_PYSSIZET, offsetof(PurgatoryObject, weakreflist), Py_READONLY,
     NULL},
    {"_max_timeout", Py_T_DOUBLE, offsetof(PurgatoryObject, max_timeout), 0, NULL},
    {"_cancelled", Py_T_PYSSIZET, offsetof(PurgatoryObject, cancelled), 0, NULL},
    {"_completed", Py_T_PYSSIZET, offsetof(PurgatoryObject, completed), 0, NULL},
    {"_closed", Py_T_BOOL, offsetof(PurgatoryObject, closed), 0, NULL},
    {NULL},
};

/* Whether every part is in place with its native layout (a purgatory being built is not). */
static inline int
purgatory_ready_check(NativeState *st, PurgatoryObject *p)
{
    return p->attempt != NULL && p->binding != NULL && p->name != NULL &&
           p->max_pending != NULL && p->sink != NULL && p->sync_types != NULL &&
           PySet_Check(p->sync_types) && p->time_op != NULL && p->purge_queue != NULL &&
           PyList_CheckExact(p->purge_queue) && p->lists != NULL &&
           CORE_CHECK(p->lists, ListsType) && lists_ready((ListsObject *)p->lists) &&
           p->rule != NULL && CORE_CHECK(p->rule, RuleType) &&
           rule_ready(st, (RuleObject *)p->rule) && p->timer != NULL &&
           CORE_CHECK(p->timer, TimerType) && timer_ready(st, (TimerObject *)p->timer);
}

/* Set up: its own `ready`, and its parts' (the lists, the rule, the timer, and theirs: reset by
 * their own assignments and clear, which the purgatory is not told of) still set, else checked
 * again. */
static inline int
purgatory_ready(NativeState *st, PurgatoryObject *o)
{
    return (o->ready && lists_ready((ListsObject *)o->lists) &&
            rule_ready(st, (RuleObject *)o->rule) && timer_ready(st, (TimerObject *)o->timer)) ||
           (o->ready = (char)purgatory_ready_check(st, o));
}

/* `sink.<list> += items`, then `sink.take()` if `limit_check` and it holds `limit` items. */
static int
sink_extend(NativeState *st, PyObject *sink, PyObject *list_name, SlotCache *list_slot,
            PyObject **items,
            Py_ssize_t n, int take_when)
{
    PyObject *list = get_slot(sink, list_name, list_slot);
    if (list == NULL) {
        return -1;
    }
    int err = 0;
    for (Py_ssize_t i = 0; i < n && err == 0; i++) {
        err = PyList_Append(list, items[i]);
    }
    if (err < 0) {
        Py_DECREF(list);
        return -1;
    }
    int take = 0;
    if (take_when == 1) { /* the limit */
        PyObject *limit = get_slot(sink, N.s_limit, &N.slot_limit);
        if (limit == NULL) {
            Py_DECREF(list);
            return -1;
        }
        PyObject *size = PyLong_FromSsize_t(PyList_GET_SIZE(list));
        take = size == NULL ? -1 : PyObject_RichCompareBool(size, limit, Py_GE);
        Py_XDECREF(size);
        Py_DECREF(limit);
    }
    else if (take_when == 2) { /* an eager sink */
        PyObject *eager = get_slot(sink, N.s_eager, &N.slot_eager);
        take = eager == NULL ? -1 : PyObject_IsTrue(eager);
        Py_XDECREF(eager);
    }
    Py_DECREF(list);
    if (take < 0) {
        return -1;
    }
    if (take) {
        return discard_result(call_method0(sink, N.s_take));
    }
    return 0;
}

/* A settled `op` off the timer: out of its bucket (its __hash__ runs: the parts are read after
 * it), one delayed operation less, one settlement more owed to the purge rule (a pass asked for
 * if it says purge). 0, or -1. */
static int
settled_untime(NativeState *st, PurgatoryObject *p, OpObject *op, PyObject *bucket)
{
    Py_INCREF(bucket);
    int err = bucket_remove(st, bucket, (PyObject *)op); /* (`op._bucket` set to None) */
    Py_DECREF(bucket);
    if (err < 0) {
        return -1;
    }
    /* (a bucket that is not the module's ran its own code: the parts are read after it) */
    TimerObject *timer = (TimerObject *)p->timer;
    timer->delayed--;
    RuleObject *rule = (RuleObject *)p->rule;
    rule->owed++;
    if (rule->owed <= rule->trip) {
        return 0;
    }
    Py_INCREF(rule);
    Py_INCREF(timer);
    int due = rule_due(st, rule);
    err = due < 0 || (due && discard_result(call_method0((PyObject *)timer, N.s_request_pass)) < 0);
    Py_DECREF(rule);
    Py_DECREF(timer);
    return err ? -1 : 0;
}

/* The event sink's record of a settlement (`sink.ends += op, outcome, now`). */
static int
settled_record(NativeState *st, PurgatoryObject *p, OpObject *op, int cancelled)
{
    PyObject *sink = Py_NewRef(p->sink);
    PyObject *now = timer_now((TimerObject *)p->timer);
    int err = -1;
    if (now != NULL) {
        PyObject *items[3] = {(PyObject *)op, cancelled ? N.s_cancelled : N.s_completed, now};
        err = sink_extend(st, sink, N.s_ends, &N.slot_ends, items, 3, 2);
        Py_DECREF(now);
    }
    Py_DECREF(sink);
    return err;
}

/* _settled(op, outcome), `self` held by the caller. */
static int
purgatory_settled_held(NativeState *st, PyObject *self, OpObject *op, int cancelled)
{
    PurgatoryObject *p = (PurgatoryObject *)self;
    if (!purgatory_ready(st, p)) {
        return discard_result(call_method2(self, N.s_settled, (PyObject *)op,
                                           cancelled ? N.s_cancelled : N.s_completed));
    }
    PyObject *bucket = op->bucket;
    if (bucket != NULL && bucket != Py_None && settled_untime(st, p, op, bucket) < 0) {
        return -1;
    }
    if (cancelled) {
        p->cancelled++;
    }
    else {
        p->completed++;
    }
    if (op->listed && purge_queue_add(st, p->purge_queue, op) < 0) {
        return -1;
    }
    return p->sink != Py_None ? settled_record(st, p, op, cancelled) : 0;
}

/* _settled(op, outcome): the registered `op` completed (cancelled = 0) or was cancelled. The
 * purgatory is held across it: an operation's settle passes its `_owner`, which the user code
 * the settle runs (its __hash__, the clock, the event log) could drop. */
static int
purgatory_settled(NativeState *st, PyObject *self, OpObject *op, int cancelled)
{
    Py_INCREF(self);
    Py_INCREF(op);
    int err = purgatory_settled_held(st, self, op, cancelled);
    Py_DECREF(op);
    Py_DECREF(self);
    return err;
}

static PyObject *
purgatory_settled_native(NativeState *st, PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                         PyObject *kwnames)
{
    if (nargs != 2 || kwnames != NULL || !CORE_CHECK(self, PurgatoryType) ||
        !purgatory_ready(st, (PurgatoryObject *)self) || !Op_Check(args[0]) ||
        !PyUnicode_CheckExact(args[1])) {
        return NOT_HANDLED;
    }
    int completed = PyUnicode_Compare(args[1], N.s_completed) == 0;
    int err = purgatory_settled(st, self, (OpObject *)args[0], !completed);
    if (err < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* Raise the exception that the reference's helper `make(*args)` builds. */
static void
raise_made(PyObject *make, PyObject *a, PyObject *b)
{
    PyObject *exc = b != NULL ? call2(make, a, b) : a != NULL ? call1(make, a)
                                                              : PyObject_CallNoArgs(make);
    if (exc == NULL) {
        return;
    }
    PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
    Py_DECREF(exc);
}

/* `self._refuse(op)` while keeping the exception being raised. */
static void
refuse_keeping_error(PyObject *self, PyObject *op, PyObject *method)
{
    PyObject *exc = fetch_exception();
    PyObject *r = call_method1(self, method, op);
    if (r == NULL) {
        Py_XDECREF(exc);
        return;
    }
    Py_DECREF(r);
    restore_exception(exc);
}

/* `self._time_op(op)`: the timer's add straight, or whatever the purgatory uses now. */
static int
purgatory_time_op(NativeState *st, PurgatoryObject *p, OpObject *op)
{
    PyObject *time_op = Py_NewRef(p->time_op); /* (a drain from the add's user code sets it) */
    PyObject *timer = Py_NewRef(p->timer);
    int err = 2;
    if (PyMethod_Check(time_op) && PyMethod_GET_SELF(time_op) == timer &&
        CORE_CHECK(timer, TimerType) && timer_ready(st, (TimerObject *)timer)) {
        PyObject *f = PyMethod_GET_FUNCTION(time_op);
        if (Py_IS_TYPE(f, &NativeMethodType)) {
            native_fn fn = ((NativeMethodObject *)f)->fn;
            if (fn == timer_add_native) {
                err = timer_add(st, (TimerObject *)timer, op);
            }
            else if (fn == timer_add_due_native) {
                err = timer_add_due(st, (TimerObject *)timer, (PyObject *)op);
            }
        }
    }
    if (err == 2) {
        err = discard_result(call1(time_op, (PyObject *)op));
    }
    Py_DECREF(timer);
    Py_DECREF(time_op);
    return err;
}

/* The numeric thresholds the C path takes without the reference's check. */
static inline int
plain_threshold(PyObject *t)
{
    return PyLong_CheckExact(t) || (PyFloat_CheckExact(t) && !isnan(PyFloat_AS_DOUBLE(t)));
}

/* `_split_keys(keys)` for a dict whose thresholds are all plain (None, ints, floats that are
 * not NaN) and for a list: new references in *keys and *marks, 0; 1 for anything else (the
 * reference's `_split_keys` then), -1 on error. */
static int
split_keys(PyObject *given, PyObject **keys, PyObject **marks)
{
    if (PyList_CheckExact(given)) {
        *keys = PyList_AsTuple(given);
        *marks = Py_NewRef(Py_None);
        return *keys == NULL ? -1 : 0;
    }
    if (!PyDict_CheckExact(given)) {
        return 1;
    }
    /* The tuple first: its allocation may collect, and a collection may run code that changes
     * the dict. The loop that reads the dict allocates nothing. */
    Py_ssize_t size = PyDict_GET_SIZE(given);
    PyObject *tuple = PyTuple_New(size);
    if (tuple == NULL) {
        return -1;
    }
    Py_ssize_t pos = 0, i = 0;
    PyObject *key, *threshold, *uniform = NULL;
    int mixed = 0;
    while (PyDict_Next(given, &pos, &key, &threshold)) {
        if (i == size || !(threshold == Py_None || plain_threshold(threshold))) {
            Py_DECREF(tuple);
            return 1;
        }
        PyTuple_SET_ITEM(tuple, i++, Py_NewRef(key));
        if (uniform == NULL) {
            uniform = threshold;
        }
        else if (threshold != uniform) {
            mixed = 1;
        }
    }
    if (i != size) {
        Py_DECREF(tuple);
        return 1;
    }
    if (mixed || uniform == NULL) {
        *marks = PyDict_Copy(given);
        if (*marks == NULL) {
            Py_DECREF(tuple);
            return -1;
        }
    }
    else {
        *marks = Py_NewRef(uniform); /* (a value of the dict, unchanged since the loop) */
    }
    *keys = tuple;
    return 0;
}

/* `op` completed, or the purgatory shut down, while `op` was being registered (a key's or a
 * threshold's code): the reference's `_ended_in_registration`, what the watch returns. */
static int
ended_in_registration(PyObject *self, OpObject *op)
{
    PyObject *r = PyObject_CallMethod(self, "_ended_in_registration", "O", (PyObject *)op);
    if (r == NULL) {
        return -1;
    }
    int completed = PyObject_IsTrue(r);
    Py_DECREF(r);
    return completed;
}

/* The steps of a watch (purgatory_watch, below), in the reference's order. Each returns -1 on
 * an error; the ones that may end the watch early return WATCH_ON to go on, else what the watch
 * returns (1 if `op` completed in the call, 0 if not). */
#define WATCH_ON 2

/* The watch's own refusals: no keys, a timeout beyond the horizon. */
static int
watch_admit(NativeState *st, PurgatoryObject *p, OpObject *op, PyObject *keys)
{
    if (PyTuple_GET_SIZE(keys) == 0) {
        raise_made(N.no_keys, NULL, NULL);
        return -1;
    }
    if (op->timeout > p->max_timeout) {
        PyObject *timeout = PyFloat_FromDouble(op->timeout);
        PyObject *horizon = PyFloat_FromDouble(p->max_timeout);
        if (timeout != NULL && horizon != NULL) {
            raise_made(N.beyond_horizon, timeout, horizon);
        }
        Py_XDECREF(timeout);
        Py_XDECREF(horizon);
        return -1;
    }
    return 0;
}

/* `if self._binding.loop is not running_loop(): self._binding.bind()` */
static int
watch_bind(NativeState *st, PurgatoryObject *p)
{
    PyObject *loop = get_slot(p->binding, N.s_loop, &N.slot_loop);
    if (loop == NULL) {
        return -1;
    }
    PyObject *running = PyObject_CallNoArgs(N.running_loop);
    if (running == NULL) {
        Py_DECREF(loop);
        return -1;
    }
    int same_loop = loop == running;
    Py_DECREF(running);
    Py_DECREF(loop);
    if (!same_loop && discard_result(call_method0(p->binding, N.s_bind)) < 0) {
        return -1;
    }
    return 0;
}

/* The event sink's record of the watch (`sink.watches += op, keys, marks, now`). */
static int
watch_record(NativeState *st, PurgatoryObject *p, OpObject *op, PyObject *keys, PyObject *marks)
{
    PyObject *sink = Py_NewRef(p->sink);
    PyObject *now = timer_now((TimerObject *)p->timer);
    int err = -1;
    if (now != NULL) {
        PyObject *items[4] = {(PyObject *)op, keys, marks, now};
        err = sink_extend(st, sink, N.s_watches, &N.slot_watches, items, 4, 1);
        Py_DECREF(now);
    }
    Py_DECREF(sink);
    return err;
}

/* A `try_complete` that returned `claimed` (taken) on an operation it did not finish: a true
 * claim is reported (`report_false_claim`). 0, or -1. */
static inline Py_ALWAYS_INLINE int
watch_unfinished_claim(NativeState *st, OpObject *op, PyObject *claimed)
{
    int truth = PyObject_IsTrue(claimed);
    PyObject *r = truth > 0 ? call2(N.report_false_claim, (PyObject *)op, claimed) : NULL;
    Py_DECREF(claimed);
    if (truth < 0 || (truth > 0 && r == NULL)) {
        return -1;
    }
    Py_XDECREF(r);
    return 0;
}

/* Kafka's first try, before registration (a synchronous try_complete: state 0): WATCH_ON, or
 * the watch's result if the operation finished or the purgatory shut down in it. */
static int
watch_first_try(NativeState *st, PurgatoryObject *p, OpObject *op)
{
    PyObject *self = (PyObject *)p;
    PyObject *claimed = call_op_method((PyObject *)op, M_TRY_COMPLETE);
    if (claimed == NULL) {
        refuse_keeping_error(self, (PyObject *)op, N.s_refuse);
        return -1;
    }
    if (op->state & ST_FINISHED || p->closed) {
        Py_DECREF(claimed);
        PyObject *r = call_method1(self, N.s_ended_before_registration, (PyObject *)op);
        if (r == NULL) {
            return -1;
        }
        int completed = PyObject_IsTrue(r);
        Py_DECREF(r);
        return completed;
    }
    return watch_unfinished_claim(st, op, claimed) < 0 ? -1 : WATCH_ON;
}

/* `max_pending`: a full purgatory refuses the operation (-1, its error raised), else 0. */
static int
watch_room(NativeState *st, PurgatoryObject *p, OpObject *op)
{
    PyObject *delayed = PyLong_FromSsize_t(((TimerObject *)p->timer)->delayed);
    if (delayed == NULL) {
        return -1;
    }
    int full = PyObject_RichCompareBool(delayed, p->max_pending, Py_GE);
    Py_DECREF(delayed);
    if (full == 0) {
        return 0;
    }
    if (full > 0 && discard_result(call_method1((PyObject *)p, N.s_refuse, (PyObject *)op)) == 0) {
        raise_made(N.full, p->name, p->max_pending);
    }
    return -1;
}

/* Registration, on every key or, if that fails, on none: WATCH_ON, or the watch's result if
 * the keys' or thresholds' code finished the operation or shut the purgatory down. */
static int
watch_register(NativeState *st, PurgatoryObject *p, OpObject *op, PyObject *keys,
               PyObject *marks)
{
    PyObject *self = (PyObject *)p;
    PyObject *lists = Py_NewRef(p->lists);
    int err = lists_register(st, (ListsObject *)lists, op, keys, marks);
    Py_DECREF(lists);
    if (err < 0) {
        refuse_keeping_error(self, (PyObject *)op, N.s_refuse);
        return -1;
    }
    if (op->state & ST_FINISHED || p->closed) {
        return ended_in_registration(self, op);
    }
    return WATCH_ON;
}

/* The try after registration (an async operation's attempt, else `try_complete`): WATCH_ON to
 * time the operation, 1 if it completed, 0 if the purgatory shut down meanwhile; -1 on an
 * error, which abandons the operation. */
static int
watch_second_try(NativeState *st, PurgatoryObject *p, OpObject *op, int state)
{
    if (state & ST_ASYNC) {
        return discard_result(call1(p->attempt, (PyObject *)op)) < 0 ? -1 : WATCH_ON;
    }
    PyObject *claimed = call_op_method((PyObject *)op, M_TRY_COMPLETE);
    if (claimed == NULL) {
        return -1;
    }
    if (op->state & ST_FINISHED) {
        Py_DECREF(claimed);
        RuleObject *rule = (RuleObject *)Py_NewRef(p->rule);
        rule->owed++; /* registered, never timed (the purge-queue protocol) */
        int due = rule_due(st, rule);
        Py_DECREF(rule);
        if (due < 0 || (due && discard_result(call_method0(p->timer, N.s_request_pass)) < 0)) {
            return -1;
        }
        return 1;
    }
    if (watch_unfinished_claim(st, op, claimed) < 0) {
        return -1;
    }
    return p->closed ? 0 : WATCH_ON;
}

/* An error after registration: `self._abandon(op)`, then what was raised (with a clearer error
 * if the clock's time was its cause). Always -1. */
static int
watch_abandon(NativeState *st, PurgatoryObject *p, OpObject *op)
{
    PyObject *exc = fetch_exception();
    PyObject *r = call_method1((PyObject *)p, N.s_abandon, (PyObject *)op);
    if (r == NULL) {
        Py_DECREF(exc);
        return -1;
    }
    Py_DECREF(r);
    if (PyErr_GivenExceptionMatches(exc, PyExc_ValueError) ||
        PyErr_GivenExceptionMatches(exc, PyExc_TypeError) ||
        PyErr_GivenExceptionMatches(exc, PyExc_OverflowError)) {
        /* a clear error if the clock's time was the cause */
        r = call_method0(p->timer, N.s_check_clock);
        if (r == NULL) {
            PyObject *clearer = fetch_exception();
            PyException_SetContext(clearer, exc); /* (steals exc) */
            restore_exception(clearer);
            return -1;
        }
        Py_DECREF(r);
    }
    restore_exception(exc);
    return -1;
}

/* try_complete_else_watch, from the split of the keys on: 1 if `op` completed in the call, 0 if
 * not, -1 on error. `state` is the operation's state as the call began, before the keys were
 * read (user code that may complete it: the reference decides on the state it read first). */
static int
purgatory_watch(NativeState *st, PurgatoryObject *p, OpObject *op, PyObject *keys, PyObject *marks,
                int state)
{
    if (watch_admit(st, p, op, keys) < 0 || watch_bind(st, p) < 0 ||
        (p->sink != Py_None && watch_record(st, p, op, keys, marks) < 0)) {
        return -1;
    }
    int go = state == 0 ? watch_first_try(st, p, op) : WATCH_ON;
    if (go != WATCH_ON) {
        return go;
    }
    if (p->max_pending != Py_None && watch_room(st, p, op) < 0) {
        return -1;
    }
    go = watch_register(st, p, op, keys, marks);
    if (go != WATCH_ON) {
        return go;
    }
    set_field(&op->owner, (PyObject *)p);
    go = watch_second_try(st, p, op, state);
    if (go == WATCH_ON) {
        go = purgatory_time_op(st, p, op) < 0 ? -1 : 0;
    }
    return go < 0 ? watch_abandon(st, p, op) : go;
}

/* The last positional-or-keyword argument `name` of a call given `nargs` positional arguments
 * and `kwnames`: *value (borrowed, or `fallback`); 0 if the call has any other keyword (or the
 * argument twice: the reference's to refuse). */
static inline int
last_argument(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t position, PyObject *kwnames,
              PyObject *name, PyObject *fallback, PyObject **value)
{
    *value = nargs > position ? args[position] : fallback;
    if (kwnames == NULL) {
        return 1;
    }
    if (PyTuple_GET_SIZE(kwnames) != 1 || nargs > position) {
        return 0;
    }
    PyObject *given = PyTuple_GET_ITEM(kwnames, 0);
    if (given != name && PyUnicode_Compare(given, name) != 0) {
        PyErr_Clear();
        return 0;
    }
    *value = args[nargs];
    return 1;
}

/* Whether `item`'s class is one of the purgatory's synchronous types (the last one found is
 * remembered: the set only grows). 1, or 0: the reference's case. */
static inline int
watch_known_class(PurgatoryObject *p, PyObject *item)
{
    if ((PyObject *)Py_TYPE(item) == p->sync_seen) {
        return 1;
    }
    int known = PySet_Contains(p->sync_types, (PyObject *)Py_TYPE(item));
    if (known <= 0) {
        if (known < 0) {
            PyErr_Clear();
        }
        return 0;
    }
    set_field(&p->sync_seen, (PyObject *)Py_TYPE(item));
    return 1;
}

/* The watch's `keys` argument as a tuple of keys and the marks (new references in *keys and
 * *marks): a tuple as it is, a list or a plain dict here, anything else by the reference's
 * `_split_keys`. 0, or -1. */
static int
watch_split(NativeState *st, PurgatoryObject *p, PyObject *given, PyObject **keys,
            PyObject **marks)
{
    if (PyTuple_CheckExact(given)) {
        *keys = Py_NewRef(given);
        *marks = Py_NewRef(Py_None);
        return 0;
    }
    int split = split_keys(given, keys, marks);
    if (split <= 0) {
        return split;
    }
    PyObject *pair = call2(N.split_keys, given, p->lists);
    if (pair == NULL) {
        return -1;
    }
    *keys = Py_NewRef(PyTuple_GET_ITEM(pair, 0));
    *marks = Py_NewRef(PyTuple_GET_ITEM(pair, 1));
    Py_DECREF(pair);
    return 0;
}

/* `threshold=`: the marks become it, once the reference's `_check_one_threshold` accepted it
 * (skipped for a plain number on keys without marks). 0, or -1. */
static int
watch_threshold(NativeState *st, PurgatoryObject *p, PyObject *threshold, PyObject *keys,
                PyObject **marks)
{
    if (*marks != Py_None || !plain_threshold(threshold)) {
        PyObject *check[4] = {threshold, *marks, keys, p->lists};
        if (discard_result(PyObject_Vectorcall(N.check_one_threshold, check, 4, NULL)) < 0) {
            return -1;
        }
    }
    Py_SETREF(*marks, Py_NewRef(threshold));
    return 0;
}

static PyObject *
purgatory_watch_native(NativeState *st, PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                       PyObject *kwnames)
{
    PyObject *threshold;
    if (nargs < 2 || nargs > 3 || !CORE_CHECK(self, PurgatoryType) ||
        !last_argument(args, nargs, 2, kwnames, N.s_threshold, Py_None, &threshold)) {
        return NOT_HANDLED;
    }
    PurgatoryObject *p = (PurgatoryObject *)self;
    PyObject *item = args[0];
    if (!purgatory_ready(st, p) || p->closed || !Op_Check(item) || !op_is_set_up(item)) {
        return NOT_HANDLED;
    }
    OpObject *op = (OpObject *)item;
    if (op->owner != Py_None || op->state & ST_FINISHED || !watch_known_class(p, item)) {
        return NOT_HANDLED;
    }
    PyObject *keys = NULL, *marks = NULL;
    int state = op->state; /* (read before the keys are: the reference's order) */
    Py_INCREF(self);
    Py_INCREF(item);
    int result = watch_split(st, p, args[1], &keys, &marks);
    if (result == 0 && threshold != Py_None) {
        result = watch_threshold(st, p, threshold, keys, &marks);
    }
    if (result == 0) {
        result = purgatory_watch(st, p, op, keys, marks, state);
    }
    Py_XDECREF(keys);
    Py_XDECREF(marks);
    Py_DECREF(item);
    Py_DECREF(self);
    if (result < 0) {
        return NULL;
    }
    return PyBool_FromLong(result);
}

static PyObject *
purgatory_check_native(NativeState *st, PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                       PyObject *kwnames)
{
    PyObject *reached;
    if (nargs < 1 || nargs > 2 || !CORE_CHECK(self, PurgatoryType) ||
        !last_argument(args, nargs, 1, kwnames, N.s_reached, Py_None, &reached)) {
        return NOT_HANDLED;
    }
    PurgatoryObject *p = (PurgatoryObject *)self;
    if (!purgatory_ready(st, p) || !plain_reached(reached)) {
        return NOT_HANDLED;
    }
    Py_INCREF(self);
    PyObject *result = NULL;
    /* `if get_ident() != self._binding.thread: self._binding.check_thread()` */
    PyObject *thread = get_slot(p->binding, N.s_thread, &N.slot_thread);
    if (thread == NULL) {
        goto done;
    }
    int same = 0;
    if (PyLong_CheckExact(thread)) {
        unsigned long ident = PyLong_AsUnsignedLong(thread);
        if (ident == (unsigned long)-1 && PyErr_Occurred()) {
            PyErr_Clear();
        }
        else {
            same = ident == PyThread_get_thread_ident();
        }
    }
    Py_DECREF(thread);
    if (!same && discard_result(call_method0(p->binding, N.s_check_thread)) < 0) {
        goto done;
    }
    ListsObject *l = (ListsObject *)Py_NewRef(p->lists);
    PyObject *attempt = Py_NewRef(p->attempt);
    Py_ssize_t completed = lists_trigger(st, l, args[0], reached, attempt);
    Py_DECREF(attempt);
    Py_DECREF(l);
    if (completed >= 0) {
        result = PyLong_FromSsize_t(completed);
    }
done:
    Py_DECREF(self);
    return result;
}
