/* The timer's hot methods (purgatory/_timer.py: add, add_due, run_pass, next_pass_tick,
 * next_pass_at): the wheel's owner, turning seconds into ticks exactly as the reference does
 * (the same IEEE operations, in the same order; the build turns floating-point contraction
 * off), and running the passes a driver asks for. */

#define TICK_SLACK 1e-6
/* Times whose ticks a double holds exactly enough to take the C path (2**62 ticks). */
#define TICK_LIMIT 4611686018427387904.0

/* Its fields' table is TIMER_FIELDS (native.h), beside the struct. */
TYPE_LIFECYCLE(timer, TimerObject, TIMER_FIELDS, NO_FIELDS, HAS_WEAKREFS, READY_ONLY)

static PyObject *
timer_get_weakref(PyObject *self, void *closure)
{
    PyObject *list = ((TimerObject *)self)->weakreflist;
    return Py_NewRef(list == NULL ? Py_None : list);
}

static PyGetSetDef timer_getset[] = {
    FIELD(TimerObject, due_at, "_due_at"),
    FIELD(TimerObject, outcome, "_outcome"),
    FIELD(TimerObject, now, "now"),
    FIELD(TimerObject, expire, "_expire"),
    FIELD(TimerObject, housekeeping, "_housekeeping"),
    FIELD(TimerObject, alarm, "alarm"),
    FIELD(TimerObject, in_flight, "_in_flight"),
    FIELD(TimerObject, wheel, "wheel"),
    {"__weakref__", timer_get_weakref, NULL, "list of weak references to the object", NULL},
    {NULL},
};

static PyMemberDef timer_members[] = {
    {"__weaklistoffset__", Py_T_PYSSIZET, offsetof(TimerObject, weakreflist), Py_READONLY, NULL},
    {"tick", Py_T_DOUBLE, offsetof(TimerObject, tick), 0, NULL},
    {"max_timeout", Py_T_DOUBLE, offsetof(TimerObject, max_timeout), 0, NULL},
    {"time_limit", Py_T_DOUBLE, offsetof(TimerObject, time_limit), 0, NULL},
    {"delayed", Py_T_PYSSIZET, offsetof(TimerObject, delayed), 0, NULL},
    {"expired", Py_T_PYSSIZET, offsetof(TimerObject, expired), 0, NULL},
    {"drained", Py_T_PYSSIZET, offsetof(TimerObject, drained), 0, NULL},
    {"passes", Py_T_PYSSIZET, offsetof(TimerObject, passes), 0, NULL},
    {"_closed", Py_T_BOOL, offsetof(TimerObject, closed), 0, NULL},
    {"_due_now", Py_T_BOOL, offsetof(TimerObject, due_now), 0, NULL},
    {NULL},
};

static inline int
timer_ready_check(NativeState *st, TimerObject *t)
{
    return t->now != NULL && t->expire != NULL && t->housekeeping != NULL && t->alarm != NULL &&
           t->in_flight != NULL && PyList_CheckExact(t->in_flight) && t->wheel != NULL &&
           CORE_CHECK(t->wheel, WheelType) && wheel_ready(st, (WheelObject *)t->wheel) &&
           t->due_at != NULL && (PyLong_CheckExact(t->due_at) || PyFloat_CheckExact(t->due_at)) &&
           t->outcome != NULL && PyUnicode_CheckExact(t->outcome) && t->tick > 0.0;
}

/* Set up: its own `ready`, and its wheel's (reset by the wheel's own assignments and clear)
 * still set, else checked again. */
static inline int
timer_ready(NativeState *st, TimerObject *o)
{
    return (o->ready && ((CoreObject *)o->wheel)->ready) ||
           (o->ready = (char)timer_ready_check(st, o));
}

/* `due < wake_tick` as Python compares an int with whatever the alarm holds: 1, 0, -1. */
static int
tick_before(long long due, PyObject *wake_tick)
{
    if (PyFloat_CheckExact(wake_tick) && due < 9007199254740992LL && due > -9007199254740992LL) {
        return (double)due < PyFloat_AS_DOUBLE(wake_tick);
    }
    PyObject *d = PyLong_FromLongLong(due);
    if (d == NULL) {
        return -1;
    }
    int r = PyObject_RichCompareBool(d, wake_tick, Py_LT);
    Py_DECREF(d);
    return r;
}

/* `if self.alarm is not None and due < self.alarm.wake_tick: self.alarm.wake_by(due)` */
static int
timer_wake_alarm(NativeState *st, TimerObject *t, long long due)
{
    PyObject *alarm = t->alarm;
    if (alarm == Py_None) {
        return 0;
    }
    Py_INCREF(alarm);
    PyObject *wake_tick = get_slot(alarm, N.s_wake_tick, &N.slot_wake_tick);
    if (wake_tick == NULL) {
        Py_DECREF(alarm);
        return -1;
    }
    int before = tick_before(due, wake_tick);
    Py_DECREF(wake_tick);
    int err = before < 0 ? -1 : 0;
    if (before > 0) {
        PyObject *d = PyLong_FromLongLong(due);
        err = d == NULL ? -1 : discard_result(call_method1(alarm, N.s_wake_by, d));
        Py_XDECREF(d);
    }
    Py_DECREF(alarm);
    return err;
}

/* `self.now()`: the clock's time (a new reference), or NULL with an exception set.
 *
 * Every clock takes this one path: a user's own, `ManualClock`, the event loop's `time`. A bound
 * method (what `use_clock` is given: `clock.current_time`) has its function called with its self
 * through vectorcall, past the method object's own trampoline; anything else is called through
 * its own vectorcall. A clock that returns a float it keeps (`return self.now`) allocates
 * nothing, and its caller reads the double from the result. */
static inline PyObject *
timer_now(TimerObject *t)
{
    PyObject *now = Py_NewRef(t->now); /* (the clock's code may give the timer another clock) */
    PyObject *r;
    if (PyMethod_Check(now)) {
        PyObject *self = PyMethod_GET_SELF(now); /* (both held by the method, held here) */
        r = PyObject_Vectorcall(PyMethod_GET_FUNCTION(now), &self, 1, NULL);
    }
    else {
        r = PyObject_Vectorcall(now, NULL, 0, NULL);
    }
    Py_DECREF(now);
    return r;
}

/* The deadline tick of an operation timed now: ceil((now() + timeout) / tick - slack), as
 * Python computes it; LLONG_MIN with an exception set if that fails. */
static long long
timer_deadline(NativeState *st, TimerObject *t, OpObject *op)
{
    PyObject *now = timer_now(t);
    if (now == NULL) {
        return LLONG_MIN;
    }
    if (PyFloat_CheckExact(now)) {
        double x = (PyFloat_AS_DOUBLE(now) + op->timeout) / t->tick - TICK_SLACK;
        if (x > -TICK_LIMIT && x < TICK_LIMIT) {
            Py_DECREF(now);
            return (long long)ceil(x);
        }
    }
    /* Anything else (an int clock, a time out of range, NaN, not a number at all): Python's
     * own arithmetic, errors included. */
    long long deadline = LLONG_MIN;
    PyObject *timeout = PyFloat_FromDouble(op->timeout);
    PyObject *tick = PyFloat_FromDouble(t->tick);
    PyObject *slack = PyFloat_FromDouble(TICK_SLACK);
    PyObject *sum = NULL, *ratio = NULL, *less = NULL, *ceiled = NULL;
    if (timeout != NULL && tick != NULL && slack != NULL &&
        (sum = PyNumber_Add(now, timeout)) != NULL &&
        (ratio = PyNumber_TrueDivide(sum, tick)) != NULL &&
        (less = PyNumber_Subtract(ratio, slack)) != NULL &&
        (ceiled = call1(N.math_ceil, less)) != NULL) {
        if (as_tick(ceiled, &deadline) < 0) {
            deadline = LLONG_MIN;
        }
    }
    Py_DECREF(now);
    Py_XDECREF(timeout);
    Py_XDECREF(tick);
    Py_XDECREF(slack);
    Py_XDECREF(sum);
    Py_XDECREF(ratio);
    Py_XDECREF(less);
    Py_XDECREF(ceiled);
    return deadline;
}

/* After a bucket took `op`: 1 if code run meanwhile (a collection's __del__ while the wheel
 * made a level's buckets or grew its queue) settled it or shut the purgatory down, so that it
 * is taken out again and not held (the reference's `_not_held`); 0 if it is held; -1 on
 * error. */
static int
timer_not_held(NativeState *st, TimerObject *t, PyObject *op)
{
    int state;
    if (Op_Check(op)) {
        state = ((OpObject *)op)->state;
    }
    else {
        PyObject *v = PyObject_GetAttrString(op, "_state");
        long x = v == NULL ? -1 : PyLong_AsLong(v);
        Py_XDECREF(v);
        if (x == -1 && PyErr_Occurred()) {
            return -1;
        }
        state = (int)x;
    }
    if (!(state & ST_FINISHED) && !t->closed) {
        return 0;
    }
    PyObject *bucket = entry_bucket(st, op);
    if (bucket == NULL) {
        return -1;
    }
    int err = bucket == Py_None ? 0 : bucket_remove(st, bucket, op);
    Py_DECREF(bucket);
    return err < 0 ? -1 : 1;
}

/* add(op): hold `op` until now + its timeout, rounded up to the tick. The bucket takes `op` by
 * identity (no code of its runs); the wheel's add may run code (a new level's buckets), so the
 * wheel is held across it, and what that code may have done is checked after it. */
static int
timer_add(NativeState *st, TimerObject *t, OpObject *op)
{
    long long deadline = timer_deadline(st, t, op);
    if (deadline == LLONG_MIN) {
        return -1;
    }
    if (!timer_ready(st, t)) { /* (the clock's code replaced the timer's fields) */
        return wheel_changed();
    }
    WheelObject *w = (WheelObject *)Py_NewRef(t->wheel);
    long long due;
    if (deadline < w->memo_high && deadline >= w->memo_low && wheel_ready(st, w)) {
        /* the wheel's memo, inline */
        op->deadline = deadline;
        OP_SET(op) |= SET_DEADLINE;
        PyObject *bucket = Py_NewRef(w->memo_bucket);
        int err = bucket_take(st, (BucketObject *)bucket, (PyObject *)op);
        if (err == 0) {
            set_field(&op->bucket, bucket);
        }
        Py_DECREF(bucket);
        due = err < 0 ? LLONG_MIN : w->memo_due;
    }
    else {
        due = wheel_add(st, w, (PyObject *)op, deadline);
    }
    Py_DECREF(w);
    if (due == LLONG_MIN) {
        return -1;
    }
    int gone = timer_not_held(st, t, (PyObject *)op);
    if (gone) {
        return gone < 0 ? -1 : 0;
    }
    t->delayed++;
    return timer_wake_alarm(st, t, due);
}

static int
timer_add_due(NativeState *st, TimerObject *t, PyObject *op)
{
    WheelObject *w = (WheelObject *)Py_NewRef(t->wheel);
    long long current = wheel_current(w);
    if (current == LLONG_MIN && PyErr_Occurred()) {
        Py_DECREF(w);
        return -1;
    }
    long long due = wheel_add(st, w, op, current);
    Py_DECREF(w);
    if (due == LLONG_MIN) {
        return -1;
    }
    int gone = timer_not_held(st, t, op);
    if (gone) {
        return gone < 0 ? -1 : 0;
    }
    t->delayed++;
    return timer_wake_alarm(st, t, due);
}

/* The expiry callback failed (`exc`, taken): how many of `due` it expired, the others (not
 * finished) back into the wheel, due at the next pass; a failure there replaces `*exc`. */
static Py_ssize_t
timer_expire_interrupted(NativeState *st, TimerObject *t, PyObject *due, PyObject **exc)
{
    Py_ssize_t expired = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(due); i++) {
        PyObject *op = PyList_GET_ITEM(due, i);
        if (Op_Check(op) && ((OpObject *)op)->state & ST_EXPIRED) {
            expired++;
        }
    }
    if (t->closed) {
        return expired;
    }
    WheelObject *w = (WheelObject *)t->wheel;
    Py_INCREF(w);
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(due); i++) {
        PyObject *op = PyList_GET_ITEM(due, i);
        if (Op_Check(op) && !(((OpObject *)op)->state & ST_FINISHED)) {
            if (wheel_add(st, w, op, ((OpObject *)op)->deadline) == LLONG_MIN) {
                Py_SETREF(*exc, fetch_exception());
                break;
            }
            t->delayed++;
        }
    }
    Py_DECREF(w);
    return expired;
}

/* After the callback: `in_flight.pop()` (the reference's finally), the count added to the
 * outcome's total; `exc` (taken) restored, or `expired` returned. */
static Py_ssize_t
timer_expire_done(NativeState *st, TimerObject *t, PyObject *in_flight, PyObject *outcome,
                  Py_ssize_t expired, PyObject *exc)
{
    Py_ssize_t n = PyList_GET_SIZE(in_flight);
    if (n > 0 && PyList_SetSlice(in_flight, n - 1, n, NULL) < 0) {
        Py_XSETREF(exc, fetch_exception());
    }
    Py_DECREF(in_flight);
    int as_expired = PyUnicode_Compare(outcome, N.s_expired) == 0;
    Py_DECREF(outcome);
    if (as_expired) {
        t->expired += expired;
    }
    else {
        t->drained += expired;
    }
    if (exc != NULL) {
        restore_exception(exc);
        return -1;
    }
    return expired;
}

/* Expire the pending operations of `due`; if a callback interrupts the pass, what was not
 * expired yet goes back into the wheel, due at the next pass. */
static Py_ssize_t
timer_expire_taken(NativeState *st, TimerObject *t, PyObject *due, PyObject *now)
{
    PyObject *in_flight = t->in_flight;
    Py_INCREF(in_flight);
    if (PyList_Append(in_flight, due) < 0) {
        Py_DECREF(in_flight);
        return -1;
    }
    Py_ssize_t expired = 0;
    PyObject *exc = NULL;
    PyObject *outcome = Py_NewRef(t->outcome);
    PyObject *expire = Py_NewRef(t->expire); /* (a callback may tap the purgatory: expire_with) */
    PyObject *r = call3(expire, due, now, outcome);
    Py_DECREF(expire);
    if (r != NULL) {
        expired = PyLong_AsSsize_t(r);
        Py_DECREF(r);
        if (expired == -1 && PyErr_Occurred()) {
            expired = 0;
            exc = fetch_exception();
        }
    }
    else {
        exc = fetch_exception();
        expired = timer_expire_interrupted(st, t, due, &exc);
    }
    return timer_expire_done(st, t, in_flight, outcome, expired, exc);
}

/* The housekeeping asked for (`_due_at`, a tick) is this pass's if the wheel reached it: then
 * none is owed (inf). 0, or -1 on error. */
static int
timer_settle_due_at(TimerObject *t, WheelObject *w)
{
    if (!PyLong_CheckExact(t->due_at)) {
        return 0;
    }
    long long due_at = PyLong_AsLongLong(t->due_at);
    long long current = wheel_current(w);
    if ((due_at == -1 || current == LLONG_MIN) && PyErr_Occurred()) {
        return -1;
    }
    if (due_at <= current) {
        PyObject *inf = PyFloat_FromDouble(INFINITY);
        if (inf == NULL) {
            return -1;
        }
        Py_SETREF(t->due_at, inf);
    }
    return 0;
}

/* The pass's housekeeping (`_housekeeping(taken, budget)`): whether another pass is owed now
 * (`due_now`). 0, or -1 on error. */
static int
timer_housekeep(TimerObject *t, Py_ssize_t taken, PyObject *budget_obj)
{
    PyObject *taken_obj = PyLong_FromSsize_t(taken);
    if (taken_obj == NULL) {
        return -1;
    }
    PyObject *housekeeping = Py_NewRef(t->housekeeping);
    PyObject *owed = call2(housekeeping, taken_obj, budget_obj);
    Py_DECREF(housekeeping);
    Py_DECREF(taken_obj);
    if (owed == NULL) {
        return -1;
    }
    int truth = PyObject_IsTrue(owed);
    Py_DECREF(owed);
    if (truth < 0) {
        return -1;
    }
    t->due_now = (char)truth;
    return 0;
}

/* run_pass(now, budget): the pass at `now` (its float value `seconds`); how many expired. */
static Py_ssize_t
timer_run_pass(NativeState *st, TimerObject *t, PyObject *now, double seconds, PyObject *budget_obj,
               Py_ssize_t budget)
{
    if (t->closed) {
        return 0;
    }
    long long ticks = (long long)floor(seconds / t->tick + TICK_SLACK);
    WheelObject *w = (WheelObject *)t->wheel;
    Py_INCREF(w);
    PyObject *due = wheel_advance(st, w, ticks, budget);
    if (due == NULL) {
        Py_DECREF(w);
        return -1;
    }
    t->passes++;
    int err = timer_settle_due_at(t, w);
    Py_DECREF(w);
    if (err < 0) {
        Py_DECREF(due);
        return -1;
    }
    Py_ssize_t expired = 0;
    Py_ssize_t taken = PyList_GET_SIZE(due);
    if (taken) {
        t->delayed -= taken;
        expired = timer_expire_taken(st, t, due, now);
    }
    Py_DECREF(due);
    if (expired < 0 || timer_housekeep(t, taken, budget_obj) < 0) {
        return -1;
    }
    return expired;
}

static long long
timer_next_pass_tick(NativeState *st, TimerObject *t)
{
    if (t->closed) {
        return TICK_INF;
    }
    if (t->due_now) {
        return wheel_current((WheelObject *)t->wheel);
    }
    long long deadline = wheel_next_deadline(st, (WheelObject *)t->wheel);
    if (deadline == LLONG_MIN && PyErr_Occurred()) {
        return LLONG_MIN;
    }
    if (PyLong_CheckExact(t->due_at)) { /* `self._due_at if self._due_at < deadline` */
        long long due_at = PyLong_AsLongLong(t->due_at);
        if (due_at == -1 && PyErr_Occurred()) {
            return LLONG_MIN;
        }
        if (deadline == TICK_INF || due_at < deadline) {
            return due_at;
        }
    }
    return deadline;
}

/* -- the methods as Python sees them ------------------------------------------------------------ */

#define TIMER_SELF(self)                                                                         \
    if (!CORE_CHECK(self, TimerType) || !timer_ready(st, (TimerObject *)self)) {            \
        return NOT_HANDLED;                                                                      \
    }                                                                                            \
    TimerObject *t = (TimerObject *)self;

static PyObject *
timer_add_native(NativeState *st, PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                 PyObject *kwnames)
{
    TIMER_SELF(self)
    if (nargs != 1 || kwnames != NULL || !Op_Check(args[0]) ||
        (OP_SET(args[0]) & SET_TIMEOUT) == 0) {
        return NOT_HANDLED;
    }
    Py_INCREF(self);
    int err = timer_add(st, t, (OpObject *)args[0]);
    Py_DECREF(self);
    if (err < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
timer_add_due_native(NativeState *st, PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                     PyObject *kwnames)
{
    TIMER_SELF(self)
    if (nargs != 1 || kwnames != NULL) {
        return NOT_HANDLED;
    }
    Py_INCREF(self);
    int err = timer_add_due(st, t, args[0]);
    Py_DECREF(self);
    if (err < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
timer_run_pass_native(NativeState *st, PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                      PyObject *kwnames)
{
    TIMER_SELF(self)
    if (nargs < 1 || nargs > 2 || kwnames != NULL || !PyFloat_CheckExact(args[0])) {
        return NOT_HANDLED;
    }
    double seconds = PyFloat_AS_DOUBLE(args[0]);
    double ticks = seconds / t->tick + TICK_SLACK;
    if (!(ticks > -TICK_LIMIT && ticks < TICK_LIMIT)) {
        return NOT_HANDLED;
    }
    Py_ssize_t budget = -1;
    PyObject *budget_obj = nargs == 2 ? args[1] : Py_None;
    if (!budget_arg(budget_obj, &budget)) {
        return NOT_HANDLED;
    }
    Py_INCREF(self);
    Py_ssize_t expired = timer_run_pass(st, t, args[0], seconds, budget_obj, budget);
    Py_DECREF(self);
    if (expired < 0) {
        return NULL;
    }
    return PyLong_FromSsize_t(expired);
}

static PyObject *
timer_next_pass_tick_native(NativeState *st, PyObject *self, PyObject *const *args,
                            Py_ssize_t nargs,
                            PyObject *kwnames)
{
    TIMER_SELF(self)
    if (nargs != 0 || kwnames != NULL) {
        return NOT_HANDLED;
    }
    Py_INCREF(self);
    long long tick = timer_next_pass_tick(st, t);
    Py_DECREF(self);
    if (tick == LLONG_MIN && PyErr_Occurred()) {
        return NULL;
    }
    return tick_or_inf(tick);
}
