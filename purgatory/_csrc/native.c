/* purgatory._native: the native core (see native.h for what it is and how it is split).
 *
 * Built as one translation unit: this file includes the parts, then defines their types, the
 * registry of C bodies that `install` puts behind the reference's methods, and the module.
 */

#include "native.h"

static native_fn native_lookup(const char *name);

#include "method.c"
#include "operation.c"
#include "wheel.c"
#include "timer.c"
#include "thresholds.c"
#include "watchers.c"
#include "purge_rule.c"
#include "purgatory.c"

/* -- module-level functions with a C body -------------------------------------------------------- */

/* expire_due(due, now, outcome="expired", *, purge_queue, ended), as the timer calls it: through
 * a partial that gives purge_queue and ended by keyword. */
static PyObject *
expire_due_native(PyObject *due, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *slots[4] = {NULL, NULL, NULL, NULL}; /* now, outcome, purge_queue, ended */
    PyObject *const names[4] = {NULL, N.s_outcome, N.s_purge_queue, N.s_ended};
    if (nargs > 2) {
        return NOT_HANDLED;
    }
    for (Py_ssize_t i = 0; i < nargs; i++) {
        slots[i] = args[i];
    }
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, k);
        int placed = 0;
        for (int s = 1; s < 4; s++) {
            if (name == names[s] || PyUnicode_Compare(name, names[s]) == 0) {
                if (slots[s] != NULL) {
                    return NOT_HANDLED;
                }
                slots[s] = args[nargs + k];
                placed = 1;
                break;
            }
        }
        if (!placed) {
            PyErr_Clear();
            return NOT_HANDLED;
        }
    }
    if (slots[1] == NULL) {
        slots[1] = N.s_expired;
    }
    if (slots[0] == NULL || slots[2] == NULL || slots[3] == NULL || !PyList_CheckExact(due) ||
        !PyDict_CheckExact(slots[2]) || !(slots[3] == Py_None || PyList_CheckExact(slots[3]))) {
        return NOT_HANDLED;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(due); i++) {
        PyObject *op = PyList_GET_ITEM(due, i);
        if (!Op_Check(op) || (OP_SET(op) & SET_STATE) == 0) {
            return NOT_HANDLED;
        }
    }
    Py_INCREF(due);
    Py_ssize_t expired = expire_loop(due, slots[0], slots[1], slots[2], slots[3]);
    Py_DECREF(due);
    if (expired < 0) {
        return NULL;
    }
    return PyLong_FromSsize_t(expired);
}

/* -- the registry ------------------------------------------------------------------------------- */

static const NativeEntry native_entries[] = {
    {"DelayedOperation.__init__", op_init_native},
    {"DelayedOperation.force_complete", op_force_complete_native},
    {"_operation.expire_due", expire_due_native},
    {"TimingWheel.add", wheel_add_native},
    {"TimingWheel.remove", wheel_remove_native},
    {"TimingWheel.advance", wheel_advance_native},
    {"TimingWheel.next_deadline", wheel_next_deadline_native},
    {"TimingWheel._push", wheel_push_native},
    {"TimingWheel._add_level", wheel_add_level_native},
    {"TimingWheel._advance_clock", wheel_advance_clock_native},
    {"SystemTimer.add", timer_add_native},
    {"SystemTimer.add_due", timer_add_due_native},
    {"SystemTimer.run_pass", timer_run_pass_native},
    {"SystemTimer.next_pass_tick", timer_next_pass_tick_native},
    {"WatcherLists.register", lists_register_native},
    {"WatcherLists.trigger", lists_trigger_native},
    {"WatcherLists.purge", lists_purge_native},
    {"PurgeRule.due", rule_due_native},
    {"DelayedOperationPurgatory.try_complete_else_watch", purgatory_watch_native},
    {"DelayedOperationPurgatory.check_and_complete", purgatory_check_native},
    {"DelayedOperationPurgatory._settled", purgatory_settled_native},
    {NULL, NULL},
};

static native_fn
native_lookup(const char *name)
{
    for (const NativeEntry *e = native_entries; e->name != NULL; e++) {
        if (strcmp(e->name, name) == 0) {
            return e->fn;
        }
    }
    return NULL;
}

PyDoc_STRVAR(function_doc,
"function(ref, key)\n--\n\n"
"The module-level function `ref` with the native body registered as `key` (\"<module>.<name>\").");

static PyObject *
native_function(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyUnicode_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "function(ref, key)");
        return NULL;
    }
    const char *key = PyUnicode_AsUTF8(args[1]);
    if (key == NULL) {
        return NULL;
    }
    native_fn fn = native_lookup(key);
    if (fn == NULL) {
        PyErr_Format(PyExc_LookupError, "no native body for %s", key);
        return NULL;
    }
    NativeMethodObject *m = PyObject_GC_New(NativeMethodObject, &NativeMethodType);
    if (m == NULL) {
        return NULL;
    }
    m->fn = fn;
    m->ref = Py_NewRef(args[0]);
    m->vectorcall = nm_vectorcall;
    PyObject_GC_Track(m);
    return (PyObject *)m;
}

/* -- bind: the Python side's helpers --------------------------------------------------------------- */

typedef struct {
    const char *name;
    PyObject **slot;
} Helper;

PyDoc_STRVAR(bind_doc,
"bind(**helpers)\n--\n\n"
"Give the native core the reference's helpers (reports, error builders, shared sentinels); the\n"
"C bodies take the reference's path until this is done.");

static PyObject *
native_bind(PyObject *module, PyObject *args, PyObject *kwargs)
{
    Helper helpers[] = {
        {"report_exception", &N.report_exception},
        {"report_false_claim", &N.report_false_claim},
        {"report_attempt", &N.report_attempt},
        {"release_lone", &N.release_lone},
        {"threshold_of", &N.threshold_of},
        {"running_loop", &N.running_loop},
        {"expired_then_raise", &N.expired_then_raise},
        {"report_expiration", &N.report_expiration},
        {"deadline_of", &N.deadline_of},
        {"nothing_to_pop", &N.nothing_to_pop},
        {"missing", &N.missing},
        {"split_keys", &N.split_keys},
        {"check_one_threshold", &N.check_one_threshold},
        {"no_keys", &N.no_keys},
        {"beyond_horizon", &N.beyond_horizon},
        {"full", &N.full},
        {NULL, NULL},
    };
    if (PyTuple_GET_SIZE(args) != 0 || kwargs == NULL) {
        PyErr_SetString(PyExc_TypeError, "bind(**helpers) takes keywords only");
        return NULL;
    }
    Py_ssize_t given = PyDict_GET_SIZE(kwargs);
    Py_ssize_t known = 0;
    for (Helper *h = helpers; h->name != NULL; h++) {
        PyObject *value = PyDict_GetItemString(kwargs, h->name);
        if (value == NULL) {
            PyErr_Format(PyExc_TypeError, "bind() needs the helper %s", h->name);
            return NULL;
        }
        Py_XSETREF(*h->slot, Py_NewRef(value));
        known++;
    }
    if (given != known) {
        PyErr_SetString(PyExc_TypeError, "bind() was given a helper it does not know");
        return NULL;
    }
    N.bound = 1;
    Py_RETURN_NONE;
}

static PyMethodDef native_methods[] = {
    {"install", (PyCFunction)(void (*)(void))native_install, METH_FASTCALL, install_doc},
    {"function", (PyCFunction)(void (*)(void))native_function, METH_FASTCALL, function_doc},
    {"bind", (PyCFunction)(void (*)(void))native_bind, METH_VARARGS | METH_KEYWORDS, bind_doc},
    {NULL},
};

/* -- the types ------------------------------------------------------------------------------------- */


#define CORE_FLAGS (Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC)


static PyTypeObject OpType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "purgatory._operation._OperationCore",
    .tp_doc = "The fields of an operation (the operation protocol, see purgatory._operation).",
    .tp_basicsize = sizeof(OpFull),
    .tp_flags = CORE_FLAGS,
    .tp_traverse = op_traverse,
    .tp_clear = op_clear,
    .tp_dealloc = op_dealloc,
    .tp_members = op_members,
    .tp_getset = op_getset,
};

static PyTypeObject BucketType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "purgatory._wheel._BucketCore",
    .tp_doc = "The fields of a bucket of the timing wheel (a dict of entries).",
    .tp_basicsize = sizeof(BucketObject),
    .tp_flags = CORE_FLAGS,
    .tp_traverse = bucket_traverse,
    .tp_clear = bucket_clear,
    .tp_dealloc = bucket_dealloc,
    .tp_members = bucket_members,
};

static PyTypeObject WheelType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "purgatory._wheel._WheelCore",
    .tp_doc = "The fields of a timing wheel.",
    .tp_basicsize = sizeof(WheelObject),
    .tp_flags = CORE_FLAGS,
    .tp_traverse = wheel_traverse,
    .tp_clear = wheel_clear,
    .tp_dealloc = wheel_dealloc,
    .tp_getset = wheel_getset,
    .tp_members = wheel_members,
};

static PyTypeObject TimerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "purgatory._timer._TimerCore",
    .tp_doc = "The fields of a timer.",
    .tp_basicsize = sizeof(TimerObject),
    .tp_flags = CORE_FLAGS,
    .tp_traverse = timer_traverse,
    .tp_clear = timer_clear,
    .tp_dealloc = timer_dealloc,
    .tp_members = timer_members,
    .tp_getset = timer_getset,
    .tp_weaklistoffset = offsetof(TimerObject, weakreflist),
};

static PyTypeObject ThresholdType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "purgatory._thresholds._ThresholdCore",
    .tp_doc = "The fields of one key's threshold watchers.",
    .tp_basicsize = sizeof(ThresholdObject),
    .tp_flags = CORE_FLAGS,
    .tp_traverse = threshold_traverse,
    .tp_clear = threshold_clear,
    .tp_dealloc = threshold_dealloc,
    .tp_getset = threshold_getset,
    .tp_members = threshold_members,
    .tp_methods = threshold_methods,
    .tp_init = threshold_init,
};

static PyTypeObject ListsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "purgatory._watchers._ListsCore",
    .tp_doc = "The fields of a purgatory's watcher lists.",
    .tp_basicsize = sizeof(ListsObject),
    .tp_flags = CORE_FLAGS,
    .tp_traverse = lists_traverse,
    .tp_clear = lists_clear,
    .tp_dealloc = lists_dealloc,
    .tp_getset = lists_getset,
    .tp_members = lists_members,
};

static PyTypeObject RuleType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "purgatory._purge_rule._RuleCore",
    .tp_doc = "The fields of a purge rule.",
    .tp_basicsize = sizeof(RuleObject),
    .tp_flags = CORE_FLAGS,
    .tp_traverse = rule_traverse,
    .tp_clear = rule_clear,
    .tp_dealloc = rule_dealloc,
    .tp_getset = rule_getset,
    .tp_members = rule_members,
};

static PyTypeObject PurgatoryType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "purgatory._purgatory._PurgatoryCore",
    .tp_doc = "The fields of a purgatory.",
    .tp_basicsize = sizeof(PurgatoryObject),
    .tp_flags = CORE_FLAGS,
    .tp_traverse = purgatory_traverse,
    .tp_clear = purgatory_clear,
    .tp_dealloc = purgatory_dealloc,
    .tp_members = purgatory_members,
    .tp_getset = purgatory_getset,
    .tp_weaklistoffset = offsetof(PurgatoryObject, weakreflist),
};

/* -- the module ------------------------------------------------------------------------------------ */

static int
intern_names(void)
{
    struct {
        PyObject **slot;
        const char *text;
    } names[] = {
        {&N.s_try_complete, "try_complete"},
        {&N.s_on_complete, "on_complete"},
        {&N.s_on_expiration, "on_expiration"},
        {&N.s_settled, "_settled"},
        {&N.s_completed, "completed"},
        {&N.s_cancelled, "cancelled"},
        {&N.s_expired, "expired"},
        {&N.s_done, "done"},
        {&N.s_set_result, "set_result"},
        {&N.s_loop, "loop"},
        {&N.s_thread, "thread"},
        {&N.s_check_thread, "check_thread"},
        {&N.s_bind, "bind"},
        {&N.s_wake_tick, "wake_tick"},
        {&N.s_wake_by, "wake_by"},
        {&N.s_alive, "alive"},
        {&N.s_take, "take"},
        {&N.s_watches, "watches"},
        {&N.s_ends, "ends"},
        {&N.s_limit, "limit"},
        {&N.s_eager, "eager"},
        {&N.s_append, "append"},
        {&N.s_popleft, "popleft"},
        {&N.s_compact, "compact"},
        {&N.s_pop, "pop"},
        {&N.s_add_level, "_add_level"},
        {&N.s_join_plain, "_join_plain"},
        {&N.s_join_at, "_join_at"},
        {&N.s_release, "_release"},
        {&N.s_tidy, "_tidy"},
        {&N.s_fail, "_fail"},
        {&N.s_wake_awaiters, "_wake_awaiters"},
        {&N.s_refuse, "_refuse"},
        {&N.s_ended_before_registration, "_ended_before_registration"},
        {&N.s_abandon, "_abandon"},
        {&N.s_request_pass, "request_pass"},
        {&N.s_admit_type, "_admit_type"},
        {&N.s_purge_queue, "purge_queue"},
        {&N.s_ended, "ended"},
        {&N.s_unpush, "unpush"},
        {&N.s_level, "level"},
        {&N.s_in_flight, "in_flight"},
        {&N.s_after_pass, "after_pass"},
        {&N.s_unregister, "unregister"},
        {&N.s_sort, "sort"},
        {&N.s_key, "key"},
        {&N.s_discard, "_discard"},
        {&N.s_threshold, "threshold"},
        {&N.s_reached, "reached"},
        {&N.s_check_clock, "check_clock"},
        {&N.s_schedule, "_schedule"},
        {&N.s_ticks, "ticks"},
        {&N.s_outcome, "outcome"},
        {&N.s_now, "now"},
        {NULL, NULL},
    };
    for (int i = 0; names[i].slot != NULL; i++) {
        *names[i].slot = PyUnicode_InternFromString(names[i].text);
        if (*names[i].slot == NULL) {
            return -1;
        }
    }
    method_names[M_TRY_COMPLETE] = N.s_try_complete;
    method_names[M_ON_COMPLETE] = N.s_on_complete;
    method_names[M_ON_EXPIRATION] = N.s_on_expiration;
    N.kw_key = PyTuple_Pack(1, N.s_key);
    return N.kw_key == NULL ? -1 : 0;
}

static int
import_helpers(void)
{
    PyObject *heapq = PyImport_ImportModule("_heapq");
    if (heapq == NULL) {
        return -1;
    }
    N.heappush = PyObject_GetAttrString(heapq, "heappush");
    N.heappop = PyObject_GetAttrString(heapq, "heappop");
    Py_DECREF(heapq);
    PyObject *math = PyImport_ImportModule("math");
    if (math == NULL) {
        return -1;
    }
    N.math_ceil = PyObject_GetAttrString(math, "ceil");
    Py_DECREF(math);
    PyObject *collections = PyImport_ImportModule("collections");
    if (collections == NULL) {
        return -1;
    }
    N.deque_type = PyObject_GetAttrString(collections, "deque");
    Py_DECREF(collections);
    N.pop_sentinel = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type);
    return (N.heappush && N.heappop && N.math_ceil && N.deque_type && N.pop_sentinel) ? 0 : -1;
}

/* The operation's core names its fields in `__slots__`, as the reference's `_OperationCore` does
 * (purgatory._operation.FIELDS, in its order): `copyreg` reads a class's slots from there, so
 * that `copy`, `deepcopy` and `pickle` carry the C fields of an operation as they carry the
 * reference's slots (object.__getstate__ reads them through their descriptors, unset ones
 * skipped), and a copy is the same on both implementations. */
static int
declare_op_slots(void)
{
    PyObject *slots = Py_BuildValue("(ssssssssss)", "_bucket", "_deadline", "_future", "_keys",
                                    "_listed", "_marks", "_owner", "_result", "_state",
                                    "_timeout");
    if (slots == NULL) {
        return -1;
    }
    int err = PyDict_SetItemString(OpType.tp_dict, "__slots__", slots);
    Py_DECREF(slots);
    PyType_Modified(&OpType);
    return err;
}

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "purgatory._native",
    .m_doc = "The native core of purgatory: C layouts and C bodies for the hot paths of the\n"
             "pure-Python modules, which stay the reference (PURGATORY_NO_EXTENSIONS=1 selects\n"
             "them alone).",
    .m_size = -1,
    .m_methods = native_methods,
};

PyMODINIT_FUNC
PyInit__native(void)
{
    BucketType.tp_base = &PyDict_Type;
    /* The cores are made as object() makes instances (its abstract-class check and messages
     * included), and show no __new__ of their own: to `help()` and `copy` they are as the
     * reference's slotted classes are. */
    PyTypeObject *cores[] = {&OpType,    &WheelType, &TimerType,     &ThresholdType,
                             &ListsType, &RuleType,  &PurgatoryType, NULL};
    for (int i = 0; cores[i] != NULL; i++) {
        cores[i]->tp_new = PyBaseObject_Type.tp_new;
    }
    PyTypeObject *types[] = {&NativeMethodType, &OpType,   &BucketType,   &WheelType,
                             &TimerType,        &ThresholdType, &ListsType, &RuleType,
                             &PurgatoryType,    NULL};
    for (int i = 0; types[i] != NULL; i++) {
        if (PyType_Ready(types[i]) < 0) {
            return NULL;
        }
    }
    for (int i = 0; cores[i] != NULL; i++) {
        if (PyDict_DelItemString(cores[i]->tp_dict, "__new__") < 0) {
            return NULL;
        }
        PyType_Modified(cores[i]);
    }
    if (declare_op_slots() < 0) {
        return NULL;
    }
    if (intern_names() < 0 || import_helpers() < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&native_module);
    if (m == NULL) {
        return NULL;
    }
    struct {
        const char *name;
        PyTypeObject *type;
    } exported[] = {
        {"OperationCore", &OpType},   {"BucketCore", &BucketType},       {"WheelCore", &WheelType},
        {"TimerCore", &TimerType},    {"ThresholdCore", &ThresholdType}, {"ListsCore", &ListsType},
        {"RuleCore", &RuleType},      {"PurgatoryCore", &PurgatoryType}, {"NativeMethod", &NativeMethodType},
        {NULL, NULL},
    };
    for (int i = 0; exported[i].name != NULL; i++) {
        if (PyModule_AddObjectRef(m, exported[i].name, (PyObject *)exported[i].type) < 0) {
            Py_DECREF(m);
            return NULL;
        }
    }
    if (PyModule_AddIntConstant(m, "API_VERSION", NATIVE_API_VERSION) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
