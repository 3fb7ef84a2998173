/* PurgeRule (purgatory/_purge_rule.py): Kafka's rule of when to purge, its hot `due` in C over the
 * reference's fields. */

typedef struct {
    CORE_HEAD
    PyObject *lists; /* _lists: ListsObject */
    PyObject *timer; /* _timer */
    PyObject *idle_at; /* _idle_at: the time bound's purge tick (an int), or inf */
    Py_ssize_t interval, owed, purges, trip, linger;
    char purging, requested, armed, bounded;
} RuleObject;

#define RULE_FIELDS(X) X(lists) X(timer) X(idle_at)

TYPE_LIFECYCLE(rule, RuleObject, RULE_FIELDS, NO_FIELDS, NO_WEAKREFS, READY_ONLY)

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

/* Set up: its own `ready`, and its lists' (which a field's assignment or a collection's clear
 * resets without telling the rule) still set, else checked again. */
static inline int
rule_ready(NativeState *st, RuleObject *o)
{
    return (o->ready && ((CoreObject *)o->lists)->ready) ||
           (o->ready = (char)rule_ready_check(st, o));
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
