/* The operation's fields and its completion (purgatory/_operation.py).
 *
 * The fields a pure operation leaves unset until their owner writes them read as unset here
 * too (AttributeError): the object fields are NULL until written, and the four number fields
 * carry a bit each in `set`. So the reference code, which runs for every rare case, sees the
 * same operation whichever implementation made it: one whose __init__ never called
 * super().__init__ has no `_state`, as a pure one has none.
 */

#define SET_STATE 1
#define SET_TIMEOUT 2
#define SET_DEADLINE 4
#define SET_LISTED 8
#define SET_UP (SET_STATE | SET_TIMEOUT)

/* The `set` bits live beside the fields; kept out of OpObject's public layout in native.h. */
typedef struct {
    OpObject base;
    unsigned char set;
} OpFull;

#define OP_SET(op) (((OpFull *)(op))->set)

static inline int
op_is_set_up(PyObject *op)
{
    return (OP_SET(op) & SET_UP) == SET_UP && ((OpObject *)op)->owner != NULL;
}

static int purgatory_settled(NativeState *st, PyObject *purgatory, OpObject *op, int cancelled);

/* -- life ------------------------------------------------------------------------------------ */

/* Its fields' table is OP_FIELDS (native.h); `set` and the number fields hold no object. The
 * hand-written part is the `set` bits: reset as tp_clear starts (and before each release), so
 * that a cleared operation is not set up (`op_is_set_up`) and reads as a pure one whose slots a
 * collection cleared, every field unset. */
#define op_set_visit NO_MORE_visit
#define op_set_forget NO_MORE_forget
#define op_set_free NO_MORE_free

static inline void
op_set_unready(PyObject *self)
{
    OP_SET(self) = 0;
}

TYPE_LIFECYCLE(op, OpObject, OP_FIELDS, NO_FIELDS, NO_WEAKREFS, op_set)

/* __init__(self, timeout) for the common timeouts (a finite float or int >= 0); anything else
 * (a bad timeout, keywords, a class with a __setattr__ of its own, which sees the reference's
 * writes: a frozen dataclass refuses them) is the reference's. */
static PyObject *
op_init_native(NativeState *st, PyObject *self, PyObject *const *args, Py_ssize_t nargs,
               PyObject *kwnames)
{
    if (nargs != 1 || kwnames != NULL || !Op_Check(self) ||
        Py_TYPE(self)->tp_setattro != PyObject_GenericSetAttr) {
        return NOT_HANDLED;
    }
    PyObject *t = args[0];
    double timeout;
    if (PyFloat_CheckExact(t)) {
        timeout = PyFloat_AS_DOUBLE(t);
    }
    else if (PyLong_CheckExact(t)) {
        timeout = PyLong_AsDouble(t);
        if (timeout == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
            return NOT_HANDLED;
        }
    }
    else {
        return NOT_HANDLED;
    }
    if (!(timeout >= 0.0 && timeout < INFINITY)) {
        return NOT_HANDLED;
    }
    OpObject *op = (OpObject *)self;
    op->timeout = timeout;
    op->state = 0;
    OP_SET(self) |= SET_UP;
    set_field(&op->owner, Py_None);
    set_field(&op->bucket, Py_None);
    set_field(&op->future, Py_None);
    Py_RETURN_NONE;
}

/* -- the number fields, unset until written ---------------------------------------------------- */

static PyObject *
unset_error(PyObject *self, const char *name)
{
    PyErr_Format(PyExc_AttributeError, "'%.200s' object has no attribute '%s'",
                 Py_TYPE(self)->tp_name, name);
    return NULL;
}

static int
int_value(PyObject *value, long long *out)
{
    if (!PyLong_Check(value)) {
        PyErr_SetString(PyExc_TypeError, "an integer is required");
        return -1;
    }
    *out = PyLong_AsLongLong(value);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

#define OP_INT_FIELD(field, bit, pyname, ctype)                                                 \
    static PyObject *op_getter_##field(PyObject *self, void *closure)                              \
    {                                                                                           \
        if (!(OP_SET(self) & bit)) {                                                           \
            return unset_error(self, pyname);                                                   \
        }                                                                                       \
        return PyLong_FromLongLong((long long)((OpObject *)self)->field);                      \
    }                                                                                           \
    static int op_setter_##field(PyObject *self, PyObject *value, void *closure)                   \
    {                                                                                           \
        if (value == NULL) {                                                                    \
            if (!(OP_SET(self) & bit)) {                                                       \
                PyErr_SetString(PyExc_AttributeError, pyname);                                  \
                return -1;                                                                      \
            }                                                                                   \
            OP_SET(self) &= ~bit;                                                               \
            return 0;                                                                           \
        }                                                                                       \
        long long v;                                                                            \
        if (int_value(value, &v) < 0) {                                                         \
            return -1;                                                                          \
        }                                                                                       \
        ((OpObject *)self)->field = (ctype)v;                                                   \
        OP_SET(self) |= bit;                                                                    \
        return 0;                                                                               \
    }

OP_INT_FIELD(state, SET_STATE, "_state", int)
OP_INT_FIELD(deadline, SET_DEADLINE, "_deadline", long long)
OP_INT_FIELD(listed, SET_LISTED, "_listed", Py_ssize_t)

static PyObject *
op_get_timeout(PyObject *self, void *closure)
{
    if (!(OP_SET(self) & SET_TIMEOUT)) {
        return unset_error(self, "_timeout");
    }
    return PyFloat_FromDouble(((OpObject *)self)->timeout);
}

static int
op_set_timeout(PyObject *self, PyObject *value, void *closure)
{
    if (value == NULL) {
        if (!(OP_SET(self) & SET_TIMEOUT)) {
            PyErr_SetString(PyExc_AttributeError, "_timeout");
            return -1;
        }
        OP_SET(self) &= ~SET_TIMEOUT;
        return 0;
    }
    double v = PyFloat_AsDouble(value);
    if (v == -1.0 && PyErr_Occurred()) {
        return -1;
    }
    ((OpObject *)self)->timeout = v;
    OP_SET(self) |= SET_TIMEOUT;
    return 0;
}

static PyGetSetDef op_getset[] = {
    {"_state", op_getter_state, op_setter_state, NULL, NULL},
    {"_timeout", op_get_timeout, op_set_timeout, NULL, NULL},
    {"_deadline", op_getter_deadline, op_setter_deadline, NULL, NULL},
    {"_listed", op_getter_listed, op_setter_listed, NULL, NULL},
    {NULL},
};

static PyMemberDef op_members[] = {
    {"_bucket", Py_T_OBJECT_EX, offsetof(OpObject, bucket), 0, NULL},
    {"_future", Py_T_OBJECT_EX, offsetof(OpObject, future), 0, NULL},
    {"_keys", Py_T_OBJECT_EX, offsetof(OpObject, keys), 0, NULL},
    {"_marks", Py_T_OBJECT_EX, offsetof(OpObject, marks), 0, NULL},
    {"_owner", Py_T_OBJECT_EX, offsetof(OpObject, owner), 0, NULL},
    {"_result", Py_T_OBJECT_EX, offsetof(OpObject, result), 0, NULL},
    {NULL},
};

/* -- completion -------------------------------------------------------------------------------- */

/* Wake the awaiters: `future.set_result(None)` unless there is none or it is done. */
static int
op_wake(NativeState *st, OpObject *op)
{
    PyObject *future = op->future;
    if (future == NULL || future == Py_None) {
        return 0;
    }
    Py_INCREF(future);
    PyObject *done = call_method0(future, N.s_done);
    if (done == NULL) {
        Py_DECREF(future);
        return -1;
    }
    int is_done = PyObject_IsTrue(done);
    Py_DECREF(done);
    int err = is_done < 0 ? -1 : 0;
    if (is_done == 0) {
        err = discard_result(call_method1(future, N.s_set_result, Py_None));
    }
    Py_DECREF(future);
    return err;
}

/* `self._result = self.on_complete()`, or what it raised kept by `_fail`. Returns 0, or -1 with
 * the interrupt (KeyboardInterrupt, SystemExit) to propagate in `*interrupt` (a new reference;
 * no exception set), or -1 with an exception set (a failure of `_fail` itself). */
static int
op_run_on_complete(NativeState *st, OpObject *op, PyObject **interrupt)
{
    *interrupt = NULL;
    PyObject *result = call_op_method((PyObject *)op, M_ON_COMPLETE);
    if (result != NULL) {
        set_field(&op->result, result);
        Py_DECREF(result);
        return 0;
    }
    PyObject *exc = fetch_exception();
    PyObject *r = call_method1((PyObject *)op, N.s_fail, exc);
    if (r == NULL) {
        Py_DECREF(exc);
        return -1;
    }
    Py_DECREF(r);
    if (!PyErr_GivenExceptionMatches(exc, PyExc_Exception)) {
        *interrupt = exc;
        return -1;
    }
    Py_DECREF(exc);
    return 0;
}

/* force_complete: 1 if this call completed the operation, 0 if it was finished, -1 on error. */
static int
op_force_complete(NativeState *st, OpObject *op)
{
    int state = op->state;
    if (state & ST_FINISHED) {
        return 0;
    }
    op->state = state | ST_DONE;
    PyObject *owner = op->owner;
    if (owner != Py_None) {
        if (CORE_CHECK(owner, PurgatoryType)) {
            if (purgatory_settled(st, owner, op, 0) < 0) {
                return -1;
            }
        }
        else {
            Py_INCREF(owner);
            int err = discard_result(call_method2(owner, N.s_settled, (PyObject *)op,
                                                  N.s_completed));
            Py_DECREF(owner);
            if (err < 0) {
                return -1;
            }
        }
    }
    PyObject *interrupt;
    if (op_run_on_complete(st, op, &interrupt) < 0) {
        if (interrupt == NULL) {
            return -1;
        }
        /* Any BaseException but an Exception: the awaiters' outcome all the same; an interrupt
         * still interrupts, once the operation is consistent. */
        if (discard_result(call_method0((PyObject *)op, N.s_wake_awaiters)) < 0) {
            Py_DECREF(interrupt);
            return -1;
        }
        if (is_interrupt(interrupt)) {
            restore_exception(interrupt);
            return -1;
        }
        Py_DECREF(interrupt);
        return 1;
    }
    return op_wake(st, op) < 0 ? -1 : 1;
}

static PyObject *
op_force_complete_native(NativeState *st, PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                         PyObject *kwnames)
{
    if (nargs != 0 || kwnames != NULL || !Op_Check(self) || !op_is_set_up(self)) {
        return NOT_HANDLED;
    }
    Py_INCREF(self);
    int done = op_force_complete(st, (OpObject *)self);
    Py_DECREF(self);
    if (done < 0) {
        return NULL;
    }
    return PyBool_FromLong(done);
}

/* An expired operation's `on_expiration`: what it raises is reported (`_report_expiration`), and
 * an interrupt raised again once the awaiters woke. 0, or -1. */
static int
expire_notify(NativeState *st, PyObject *item)
{
    PyObject *r = call_op_method(item, M_ON_EXPIRATION);
    if (r != NULL) {
        Py_DECREF(r);
        return 0;
    }
    PyObject *exc = fetch_exception();
    PyObject *reported = call2(N.report_expiration, item, exc);
    if (reported == NULL) {
        Py_DECREF(exc);
        return -1;
    }
    Py_DECREF(reported);
    if (!is_interrupt(exc)) {
        Py_DECREF(exc);
        return 0;
    }
    if (discard_result(call_method0(item, N.s_wake_awaiters)) < 0) {
        Py_DECREF(exc);
        return -1;
    }
    restore_exception(exc);
    return -1;
}

/* One due operation, marked expired (held by the caller): into the purge queue if listed, its
 * end recorded, its `on_complete` then `on_expiration` run, its awaiters woken. 0, or -1. */
static int
expire_one(NativeState *st, OpObject *op, PyObject *now, PyObject *outcome, PyObject *purge_queue,
           PyObject *ended)
{
    PyObject *item = (PyObject *)op;
    if (op->listed && purge_queue_add(st, purge_queue, op) < 0) {
        return -1;
    }
    if (ended != Py_None && (PyList_Append(ended, item) < 0 || PyList_Append(ended, outcome) < 0 ||
                             PyList_Append(ended, now) < 0)) {
        return -1;
    }
    PyObject *interrupt;
    if (op_run_on_complete(st, op, &interrupt) < 0) {
        if (interrupt == NULL) {
            return -1;
        }
        if (is_interrupt(interrupt)) {
            PyObject *r = call2(N.expired_then_raise, item, interrupt);
            Py_DECREF(interrupt);
            Py_XDECREF(r); /* it raises */
            return -1;
        }
        Py_DECREF(interrupt);
    }
    if (expire_notify(st, item) < 0) {
        return -1;
    }
    return op_wake(st, op);
}

/* The expiry loop of a timer pass: `_operation.expire_due(due, now, purge_queue, ended)`. */
static Py_ssize_t
expire_loop(NativeState *st, PyObject *due, PyObject *now, PyObject *outcome, PyObject *purge_queue,
            PyObject *ended)
{
    Py_ssize_t expired = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(due); i++) {
        PyObject *item = PyList_GET_ITEM(due, i);
        /* the list is the timer's (`_in_flight`), reachable from the callbacks run below: what
         * they put in it is checked before it is read as an operation */
        if (!Op_Check(item) || (OP_SET(item) & SET_STATE) == 0) {
            PyErr_Format(PyExc_TypeError, "a timer pass met %R among its due operations", item);
            return -1;
        }
        OpObject *op = (OpObject *)item;
        int state = op->state;
        if (state & ST_FINISHED) {
            continue;
        }
        Py_INCREF(item);
        op->state = state | ST_EXPIRED_NOW;
        int err = expire_one(st, op, now, outcome, purge_queue, ended);
        Py_DECREF(item);
        if (err < 0) {
            return -1;
        }
        expired++;
    }
    return expired;
}
