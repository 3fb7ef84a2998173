/* purgatory._native: the native core (see native.h for what it is and how it is split).
 *
 * Built as one translation unit: this file includes the parts, then defines their types, the
 * registry of C bodies that `function` puts behind the reference's functions (the package's
 * `_impl.twin` makes the native classes with them), and the module.
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

/* The arguments of expire_due(due, now, outcome="expired", *, purge_queue, ended) after `due`,
 * as the timer's partial gives them, into `slots` (now, outcome, purge_queue, ended; the
 * outcome's default filled in): 1, or 0 for any other call (the reference's to refuse). */
static int
expire_due_args(NativeState *st, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                PyObject **slots)
{
    PyObject *const names[4] = {NULL, N.s_outcome, N.s_purge_queue, N.s_ended};
    if (nargs > 2) {
        return 0;
    }
    for (Py_ssize_t i = 0; i < nargs; i++) {
        slots[i] = args[i];
    }
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, k);
        int s = 1;
        while (s < 4 && name != names[s] && PyUnicode_Compare(name, names[s]) != 0) {
            s++;
        }
        if (s == 4 || slots[s] != NULL) {
            PyErr_Clear(); /* (a comparison with what is not a str) */
            return 0;
        }
        slots[s] = args[nargs + k];
    }
    if (slots[1] == NULL) {
        slots[1] = N.s_expired;
    }
    return slots[0] != NULL && slots[2] != NULL && slots[3] != NULL;
}

/* expire_due(due, now, outcome="expired", *, purge_queue, ended), as the timer calls it: through
 * a partial that gives purge_queue and ended by keyword. */
static PyObject *
expire_due_native(NativeState *st, PyObject *due, PyObject *const *args, Py_ssize_t nargs,
                  PyObject *kwnames)
{
    PyObject *slots[4] = {NULL, NULL, NULL, NULL}; /* now, outcome, purge_queue, ended */
    if (!expire_due_args(st, args, nargs, kwnames, slots) || !PyList_CheckExact(due) ||
        !PyList_CheckExact(slots[2]) || !(slots[3] == Py_None || PyList_CheckExact(slots[3]))) {
        return NOT_HANDLED;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(due); i++) {
        PyObject *op = PyList_GET_ITEM(due, i);
        if (!Op_Check(op) || (OP_SET(op) & SET_STATE) == 0) {
            return NOT_HANDLED;
        }
    }
    Py_INCREF(due);
    Py_ssize_t expired = expire_loop(st, due, slots[0], slots[1], slots[2], slots[3]);
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
    return native_method_new(module, fn, args[0]);
}

/* -- the Python side's helpers, pulled --------------------------------------------------------- */

/* The reference's helpers the C bodies call (its reports, its error builders, its shared
 * sentinels), so that a message or a rule is written once: where each is defined. */
typedef struct {
    const char *module;
    const char *name;
    size_t offset; /* of its field in NativeState */
} Helper;

#define HELPER(module, name, field) {"purgatory." module, name, offsetof(NativeState, field)}

static const Helper helpers[] = {
    HELPER("_asyncio", "report_exception", report_exception),
    HELPER("_asyncio", "report_false_claim", report_false_claim),
    HELPER("_asyncio", "running_loop", running_loop),
    HELPER("_watchers", "_report_attempt", report_attempt),
    HELPER("_watchers", "_release_lone", release_lone),
    HELPER("_watchers", "_NOTHING_TO_POP", nothing_to_pop),
    HELPER("_thresholds", "threshold_of", threshold_of),
    HELPER("_operation", "_expired_then_raise", expired_then_raise),
    HELPER("_operation", "_report_expiration", report_expiration),
    HELPER("_wheel", "_deadline_of", deadline_of),
    HELPER("_purgatory", "_split_keys", split_keys),
    HELPER("_purgatory", "_check_one_threshold", check_one_threshold),
    HELPER("_purgatory", "_no_keys", no_keys),
    HELPER("_purgatory", "_beyond_horizon", beyond_horizon),
    HELPER("_purgatory", "_full", full),
    {NULL, NULL, 0},
};

/* Take the helpers from the package's modules, once per module state: 1 once they are all there.
 * Not at the module's exec, as `_asyncio`'s module_init imports what it needs: the package's
 * modules import this one (through `purgatory._impl`) before they define them, so importing them
 * from here would import a module that is still being imported. So the first call of a C body
 * takes them from `sys.modules` (no import is started, no code of the user's runs), and only from
 * the package whose `_impl.native` is this very module (the test suite keeps a second, pure copy
 * of the package, swapped into `sys.modules` while its tests run). Until the facade's module is
 * whole (0: during the package's own import), the reference's bodies run, as they do for any
 * case the C leaves to them. */
static int
native_pull_helpers(PyObject *m)
{
    NativeState *st = PyModule_GetState(m);
    if (N.s_impl_module == NULL) {
        return 0; /* (the module was cleared: the reference's bodies run) */
    }
    PyObject *values[sizeof helpers / sizeof *helpers] = {NULL};
    PyObject *impl = PyImport_GetModule(N.s_impl_module);
    PyObject *native = impl == NULL ? NULL : PyObject_GetAttr(impl, N.s_native);
    Py_XDECREF(impl);
    int whole = native == m;
    Py_XDECREF(native);
    for (size_t i = 0; helpers[i].module != NULL && whole; i++) {
        PyObject *name = PyUnicode_FromString(helpers[i].module);
        PyObject *module = name == NULL ? NULL : PyImport_GetModule(name);
        Py_XDECREF(name);
        values[i] = module == NULL ? NULL : PyObject_GetAttrString(module, helpers[i].name);
        Py_XDECREF(module);
        whole = values[i] != NULL;
    }
    if (!whole) {
        PyErr_Clear(); /* (a module not there yet, or not whole: an AttributeError) */
        for (size_t i = 0; helpers[i].module != NULL; i++) {
            Py_XDECREF(values[i]);
        }
        return 0;
    }
    for (size_t i = 0; helpers[i].module != NULL; i++) {
        Py_XSETREF(*(PyObject **)((char *)st + helpers[i].offset), values[i]);
    }
    N.bound = 1;
    return 1;
}

static PyMethodDef native_methods[] = {
    {"function", (PyCFunction)(void (*)(void))native_function, METH_FASTCALL, function_doc},
    {NULL},
};

/* -- the types ------------------------------------------------------------------------------------- */

/* Heap types (PEP 630), one set per module object: each core is subclassable (the reference's
 * classes are defined over it), collected, and immutable as the static types it replaces were.
 * No tp_new of their own: they inherit object's, and so show no __new__,
 * and are made as object() makes instances (its abstract-class check and messages included): to
 * `help()` and `copy` they are as the reference's slotted classes are. */
#define CORE_FLAGS                                                                                \
    (Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE)

#define CORE_SPEC(var, pyname, doc, type, prefix, ...)                                          \
    static PyType_Slot var##_slots[] = {                                                         \
        {Py_tp_doc, (void *)(doc)},                                                              \
        {Py_tp_traverse, prefix##_traverse},                                                     \
        {Py_tp_clear, prefix##_clear},                                                           \
        {Py_tp_dealloc, prefix##_dealloc},                                                       \
        {Py_tp_members, prefix##_members},                                                       \
        __VA_ARGS__{0, NULL},                                                                    \
    };                                                                                           \
    static PyType_Spec var##_spec = {                                                            \
        .name = (pyname),                                                                        \
        .basicsize = sizeof(type),                                                               \
        .flags = CORE_FLAGS,                                                                     \
        .slots = var##_slots,                                                                    \
    };

CORE_SPEC(op, "purgatory._operation._OperationCore",
          "The fields of an operation (the operation protocol, see purgatory._operation).",
          OpFull, op, {Py_tp_getset, op_getset},)
CORE_SPEC(bucket, "purgatory._wheel._BucketCore",
          "The fields of a bucket of the timing wheel (a list of entries, by identity).",
          BucketObject, bucket, {Py_tp_methods, bucket_methods}, {Py_tp_iter, bucket_iter},
          {Py_sq_length, bucket_length}, {Py_mp_length, bucket_length},
          {Py_sq_contains, bucket_contains},
          {Py_mp_ass_subscript, bucket_ass_subscript},)
CORE_SPEC(wheel, "purgatory._wheel._WheelCore", "The fields of a timing wheel.", WheelObject,
          wheel, {Py_tp_getset, wheel_getset},)
CORE_SPEC(timer, "purgatory._timer._TimerCore", "The fields of a timer.", TimerObject, timer,
          {Py_tp_getset, timer_getset},)
CORE_SPEC(threshold, "purgatory._thresholds._ThresholdCore",
          "The fields of one key's threshold watchers.", ThresholdObject, threshold,
          {Py_tp_getset, threshold_getset}, {Py_tp_methods, threshold_methods},
          {Py_tp_init, threshold_init},)
CORE_SPEC(lists, "purgatory._watchers._ListsCore", "The fields of a purgatory's watcher lists.",
          ListsObject, lists, {Py_tp_getset, lists_getset},)
CORE_SPEC(rule, "purgatory._purge_rule._RuleCore", "The fields of a purge rule.", RuleObject,
          rule, {Py_tp_getset, rule_getset},)
CORE_SPEC(purgatory, "purgatory._purgatory._PurgatoryCore", "The fields of a purgatory.",
          PurgatoryObject, purgatory, {Py_tp_getset, purgatory_getset},)

/* -- the module ------------------------------------------------------------------------------------ */

/* The names the C looks up or calls, interned once into their fields of the state. */
typedef struct {
    size_t offset; /* of its field in NativeState */
    const char *text;
} Interned;

#define INTERNED(field, text) {offsetof(NativeState, field), text}

static const Interned interned[] = {
    INTERNED(s_try_complete, "try_complete"),
    INTERNED(s_on_complete, "on_complete"),
    INTERNED(s_on_expiration, "on_expiration"),
    INTERNED(s_settled, "_settled"),
    INTERNED(s_completed, "completed"),
    INTERNED(s_cancelled, "cancelled"),
    INTERNED(s_expired, "expired"),
    INTERNED(s_done, "done"),
    INTERNED(s_set_result, "set_result"),
    INTERNED(s_loop, "loop"),
    INTERNED(s_thread, "thread"),
    INTERNED(s_check_thread, "check_thread"),
    INTERNED(s_bind, "bind"),
    INTERNED(s_wake_tick, "wake_tick"),
    INTERNED(s_wake_by, "wake_by"),
    INTERNED(s_take, "take"),
    INTERNED(s_watches, "watches"),
    INTERNED(s_ends, "ends"),
    INTERNED(s_limit, "limit"),
    INTERNED(s_eager, "eager"),
    INTERNED(s_pop, "pop"),
    INTERNED(s_join_plain, "_join_plain"),
    INTERNED(s_join_at, "_join_at"),
    INTERNED(s_tidy, "_tidy"),
    INTERNED(s_fail, "_fail"),
    INTERNED(s_wake_awaiters, "_wake_awaiters"),
    INTERNED(s_refuse, "_refuse"),
    INTERNED(s_ended_before_registration, "_ended_before_registration"),
    INTERNED(s_abandon, "_abandon"),
    INTERNED(s_request_pass, "request_pass"),
    INTERNED(s_purge_queue, "purge_queue"),
    INTERNED(s_ended, "ended"),
    INTERNED(s_sort, "sort"),
    INTERNED(s_key, "key"),
    INTERNED(s_discard, "_discard"),
    INTERNED(s_threshold, "threshold"),
    INTERNED(s_reached, "reached"),
    INTERNED(s_remove, "remove"),
    INTERNED(s_check_clock, "check_clock"),
    INTERNED(s_schedule, "_schedule"),
    INTERNED(s_ticks, "ticks"),
    INTERNED(s_outcome, "outcome"),
    INTERNED(s_now, "now"),
    INTERNED(s_gone, "_gone"),
    INTERNED(s_impl_module, "purgatory._impl"),
    INTERNED(s_native, "native"),
    {0, NULL},
};

static int
intern_names(NativeState *st)
{
    for (size_t i = 0; interned[i].text != NULL; i++) {
        PyObject **slot = (PyObject **)((char *)st + interned[i].offset);
        *slot = PyUnicode_InternFromString(interned[i].text);
        if (*slot == NULL) {
            return -1;
        }
    }
    N.method_names[M_TRY_COMPLETE] = N.s_try_complete;
    N.method_names[M_ON_COMPLETE] = N.s_on_complete;
    N.method_names[M_ON_EXPIRATION] = N.s_on_expiration;
    N.kw_key = PyTuple_Pack(1, N.s_key);
    return N.kw_key == NULL ? -1 : 0;
}

static int
import_helpers(NativeState *st)
{
    PyObject *math = PyImport_ImportModule("math");
    if (math == NULL) {
        return -1;
    }
    N.math_ceil = PyObject_GetAttrString(math, "ceil");
    Py_DECREF(math);
    N.pop_sentinel = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type);
    N.dict_pop_method = PyObject_GetAttrString((PyObject *)&PyDict_Type, "pop");
    if (N.dict_pop_method != NULL && Py_IS_TYPE(N.dict_pop_method, &PyMethodDescr_Type)) {
        PyMethodDef *def = ((PyMethodDescrObject *)N.dict_pop_method)->d_method;
        if ((def->ml_flags & ~METH_COEXIST) == METH_FASTCALL) {
            N.dict_pop_fast =
                (PyObject * (*)(PyObject *, PyObject *const *, Py_ssize_t))(void (*)(void))
                    def->ml_meth;
        }
    }
    return (N.math_ceil && N.pop_sentinel && N.dict_pop_method) ? 0 : -1;
}

/* The operation's core names its fields in `__slots__`, as the reference's `_OperationCore` does
 * (purgatory._operation.FIELDS, in its order): `copyreg` reads a class's slots from there, so
 * that `copy`, `deepcopy` and `pickle` carry the C fields of an operation as they carry the
 * reference's slots (object.__getstate__ reads them through their descriptors, unset ones
 * skipped), and a copy is the same on both implementations. */
static int
declare_op_slots(NativeState *st)
{
    PyObject *slots = Py_BuildValue("(ssssssssss)", "_bucket", "_deadline", "_future", "_keys",
                                    "_listed", "_marks", "_owner", "_result", "_state",
                                    "_timeout");
    if (slots == NULL) {
        return -1;
    }
    /* (a heap type's dict, written once before the type is published, as PyType_Ready does) */
    int err = PyDict_SetItemString(OpType.tp_dict, "__slots__", slots);
    Py_DECREF(slots);
    PyType_Modified(&OpType);
    return err;
}

/* The module's exec (PEP 489): its types, names and imports into its state, then its
 * attributes. A failure leaves what was made in the state, released by the module's clear. */
static int
native_exec(PyObject *m)
{
    NativeState *st = PyModule_GetState(m);
    struct {
        PyTypeObject **slot;
        PyType_Spec *spec;
        PyObject *base;
        const char *name;
    } types[] = {
        {&N.native_method_type, &nm_spec, NULL, "NativeMethod"},
        {&N.op_type, &op_spec, NULL, "OperationCore"},
        {&N.bucket_type, &bucket_spec, NULL, "BucketCore"},
        {&N.wheel_type, &wheel_spec, NULL, "WheelCore"},
        {&N.timer_type, &timer_spec, NULL, "TimerCore"},
        {&N.threshold_type, &threshold_spec, NULL, "ThresholdCore"},
        {&N.lists_type, &lists_spec, NULL, "ListsCore"},
        {&N.rule_type, &rule_spec, NULL, "RuleCore"},
        {&N.purgatory_type, &purgatory_spec, NULL, "PurgatoryCore"},
        {NULL, NULL, NULL, NULL},
    };
    for (int i = 0; types[i].slot != NULL; i++) {
        PyObject *type = PyType_FromModuleAndSpec(m, types[i].spec, types[i].base);
        if (type == NULL) {
            return -1;
        }
        *types[i].slot = (PyTypeObject *)type;
    }
    if (declare_op_slots(st) < 0 || intern_names(st) < 0 || import_helpers(st) < 0) {
        return -1;
    }
    for (int i = 0; types[i].slot != NULL; i++) {
        if (PyModule_AddObjectRef(m, types[i].name, (PyObject *)*types[i].slot) < 0) {
            return -1;
        }
    }
    return PyModule_AddIntConstant(m, "API_VERSION", NATIVE_API_VERSION);
}

static int
native_traverse(PyObject *m, visitproc visit, void *arg)
{
    NativeState *st = PyModule_GetState(m);
    if (st == NULL) {
        return 0;
    }
    for (size_t i = 0; i < NATIVE_OBJECT_COUNT; i++) {
        Py_VISIT(NATIVE_OBJECTS(st)[i]);
    }
    for (int e = 0; e < METHOD_CACHE_SIZE; e++) {
        Py_VISIT(N.method_cache[e].type);
        for (int k = 0; k < M_COUNT; k++) {
            Py_VISIT(N.method_cache[e].methods[k]);
        }
    }
    SlotCache *slots[] = {&N.slot_loop,    &N.slot_thread, &N.slot_wake_tick, &N.slot_watches,
                          &N.slot_ends,    &N.slot_limit,  &N.slot_eager};
    for (size_t i = 0; i < sizeof slots / sizeof *slots; i++) {
        Py_VISIT(slots[i]->type);
    }
    return 0;
}

static int
native_clear(PyObject *m)
{
    NativeState *st = PyModule_GetState(m);
    if (st == NULL) {
        return 0;
    }
    N.bound = 0; /* (a method still called after this takes the reference's path) */
    for (size_t i = 0; i < NATIVE_OBJECT_COUNT; i++) {
        Py_CLEAR(NATIVE_OBJECTS(st)[i]);
    }
    for (int e = 0; e < METHOD_CACHE_SIZE; e++) {
        method_entry_clear(&N.method_cache[e]);
    }
    SlotCache *slots[] = {&N.slot_loop,    &N.slot_thread, &N.slot_wake_tick, &N.slot_watches,
                          &N.slot_ends,    &N.slot_limit,  &N.slot_eager};
    for (size_t i = 0; i < sizeof slots / sizeof *slots; i++) {
        slots[i]->member = NULL;
        slots[i]->tag = 0;
        Py_CLEAR(slots[i]->type);
    }
    return 0;
}

static void
native_free(void *m)
{
    native_clear((PyObject *)m);
}

static PyModuleDef_Slot native_slots[] = {
    {Py_mod_exec, native_exec},
    {0, NULL},
};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "purgatory._native",
    .m_doc = "The native core of purgatory: C layouts and C bodies for the hot paths of the\n"
             "pure-Python modules, which stay the reference (PURGATORY_NO_EXTENSIONS=1 selects\n"
             "them alone).",
    .m_size = sizeof(NativeState),
    .m_methods = native_methods,
    .m_slots = native_slots,
    .m_traverse = native_traverse,
    .m_clear = native_clear,
    .m_free = native_free,
};

PyMODINIT_FUNC
PyInit__native(void)
{
    return PyModuleDef_Init(&native_module);
}
