/* The native core: what its parts share.
 *
 * The pure-Python modules (purgatory/_operation.py, _wheel.py, _timer.py, _watchers.py,
 * _thresholds.py, _purge_rule.py, _purgatory.py) are the specification, whole in every process.
 * This extension gives each of their hot types a native twin (`purgatory._impl.twin`): the same
 * class namespace over a C layout (struct fields instead of slots, the same names seen from
 * Python), with a C body for its hot methods; every cold method is the Python one, shared, and
 * works on the same fields. A C method that meets anything unusual (an argument of another type, a rare branch)
 * returns NOT_HANDLED before any side effect, and the reference function runs instead
 * (`NativeMethod`): the rare paths, their errors and their messages are the reference's own.
 *
 * The whole extension is one translation unit (native.c includes the parts), so the parts call
 * each other directly and the compiler inlines across them.
 */

#ifndef PURGATORY_NATIVE_H
#define PURGATORY_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

#include <structmember.h> /* (T_OBJECT: see MEMBER_OBJECT_OR_NONE) */
#if PY_VERSION_HEX < 0x030C0000
#define Py_T_INT T_INT
#define Py_T_DOUBLE T_DOUBLE
#define Py_T_LONGLONG T_LONGLONG
#define Py_T_PYSSIZET T_PYSSIZET
#define Py_T_OBJECT_EX T_OBJECT_EX
#define Py_T_BOOL T_BOOL
#define Py_READONLY READONLY
#endif
/* An object member that reads None while unset: 3.12 has no public Py_T_ name for it (only
 * a private underscored one); structmember.h's T_OBJECT is the public, deprecated one. */
#define MEMBER_OBJECT_OR_NONE T_OBJECT

/* Bumped whenever a field or a method moves between the C and the Python side: the Python
 * modules refuse a build of another version (a stale build after a checkout). */
#define NATIVE_API_VERSION 5

/* -- the operation's state bits (purgatory/_operation.py) ------------------------------------ */
#define ST_ASYNC 1
#define ST_DONE 2
#define ST_EXPIRED 4
#define ST_CANCELLED 8
#define ST_FAILED 16
#define ST_CLOSED 32
#define ST_FINISHED (ST_DONE | ST_CANCELLED)
#define ST_EXPIRED_NOW (ST_DONE | ST_EXPIRED)

/* What a C method returns to have the reference function run instead (no exception set). */
static char not_handled_marker;
#define NOT_HANDLED ((PyObject *)&not_handled_marker)

typedef struct NativeState NativeState;

/* A C body: the module's state, then the method's arguments as vectorcall gives them. */
typedef PyObject *(*native_fn)(NativeState *st, PyObject *self, PyObject *const *args,
                               Py_ssize_t nargs, PyObject *kwnames);

/* -- the types ------------------------------------------------------------------------------ */

/* A place in a bucket's list (Kafka's TimerTaskEntry): a bucket is an intrusive doubly linked
 * list through its entries, by identity (no entry's __hash__ or __eq__ is ever called). An
 * operation carries its own link (in its C layout); any other entry gets one made for it while
 * a bucket holds it (`heap`). The list holds a strong reference to each entry, in `entry`. */
typedef struct TimerLink {
    struct TimerLink *prev, *next;
    PyObject *entry; /* the bucket's strong reference while linked, else NULL */
    PyObject *list;  /* the bucket that links it (borrowed: a bucket unlinks all before it goes) */
    char heap;       /* made for an entry that is not an operation (PyMem), freed as it leaves */
} TimerLink;

typedef struct {
    PyObject_HEAD
    int state;           /* _state */
    double timeout;      /* _timeout */
    long long deadline;  /* _deadline: the wheel's */
    Py_ssize_t listed;   /* _listed: the watcher lists' */
    PyObject *bucket;    /* _bucket: the wheel's (None when not held) */
    PyObject *future;    /* _future */
    PyObject *keys;      /* _keys: the watcher lists' */
    PyObject *marks;     /* _marks: the watcher lists' */
    PyObject *owner;     /* _owner: NULL until __init__ ran (a set-up operation has None) */
    PyObject *result;    /* _result */
    TimerLink link;      /* its place in the bucket that holds it: the bucket's, not a field */
} OpObject;

/* The operation's owned object fields (its lifecycle, operation.c: TYPE_LIFECYCLE). */
#define OP_FIELDS(X) X(bucket) X(future) X(keys) X(marks) X(owner) X(result)

/* A bucket of the wheel (purgatory/_wheel.py's Bucket): its entries in insertion order, as a
 * circular list through `head` (NULL links until the first entry: an empty list). */
typedef struct {
    PyObject_HEAD
    long long expiration;
    int level;
    PyObject *older;  /* NULL reads as None */
    PyObject *wheel;
    TimerLink head;   /* the sentinel: head.next is the oldest entry, head.prev the newest */
    Py_ssize_t size;
    PyObject *others; /* {id(entry): its link's address} for entries that are not operations */
} BucketObject;

/* The bucket's owned object fields (wheel.c: TYPE_LIFECYCLE; its entries are the hand-written
 * part, bucket_entries: a walk of its list). `others` holds ints only: cleared first, it runs
 * nothing. */
#define BUCKET_FIELDS(X) X(older) X(wheel) X(others)

/* The head of the types whose object fields Python code may replace: `ready` says every field
 * was checked to have what the C bodies expect; assigning a field from Python (its setter,
 * `field_set`) clears it, and the next C call checks again. */
#define CORE_HEAD \
    PyObject_HEAD \
    char ready;

typedef struct {
    CORE_HEAD
} CoreObject;

/* A bucket's place in the wheel's queue of buckets by due tick: the reference's tuple
 * (tick, -level, push count, bucket), compared in that order (the count is unique). */
typedef struct {
    long long tick, count;
    int neg_level;
    PyObject *bucket; /* a strong reference */
} WheelItem;

/* Ticks per level, as C integers (`v` NULL: never set, the attribute is missing). */
typedef struct {
    long long *v;
    Py_ssize_t n, cap;
} TickArray;

typedef struct {
    CORE_HEAD
    PyObject *active;   /* _active: the cascading Bucket or NULL (None) */
    PyObject *levels;   /* _levels: list of list of Bucket */
    PyObject *overdue;  /* _overdue: Bucket */
    PyObject *slots1;   /* _slots1: list of Bucket */
    PyObject *todo;     /* _todo: list */
    PyObject *memo_bucket;
    TickArray current;  /* _current: the current tick truncated to each level's span */
    TickArray spans;    /* _spans: ticks per bucket of each level */
    TickArray leads;    /* _leads: how long before its span a bucket's cascade is due */
    WheelItem *heap;    /* _heap: a binary heap kept as heapq keeps the reference's list */
    Py_ssize_t heap_len, heap_cap;
    char heap_set;      /* _heap was assigned (the reference's __init__ ran) */
    long long lead1, limit1, memo_until, push_count, span1;
    long long memo_due, memo_high, memo_low;
    Py_ssize_t todo_done, wheel_size;
} WheelObject;

/* The wheel's owned object fields (wheel.c: TYPE_LIFECYCLE; its queue of buckets and its tick
 * arrays are the hand-written part, wheel_queue). */
#define WHEEL_FIELDS(X) X(active) X(levels) X(overdue) X(slots1) X(todo) X(memo_bucket)

typedef struct {
    CORE_HEAD
    PyObject *weakreflist;
    double tick, max_timeout, time_limit;
    PyObject *now;          /* callable */
    PyObject *expire;       /* _expire: callable(due, now) */
    PyObject *housekeeping; /* _housekeeping: callable(taken, budget) */
    PyObject *alarm;        /* None or an Alarm */
    PyObject *in_flight;    /* _in_flight: list of lists */
    PyObject *wheel;        /* WheelObject (checked as it is set) */
    PyObject *due_at;       /* _due_at: the tick housekeeping is owed by (an int), or inf */
    PyObject *outcome;      /* _outcome: what the passes expire, "expired" or "drained" */
    Py_ssize_t delayed, expired, drained, passes;
    char closed, due_now;
} TimerObject;

/* The timer's owned object fields (timer.c: TYPE_LIFECYCLE). */
#define TIMER_FIELDS(X)                                                                         \
    X(now) X(expire) X(housekeeping) X(alarm) X(in_flight) X(wheel) X(due_at) X(outcome)

typedef struct {
    CORE_HEAD
    PyObject *weakreflist;
    PyObject *attempt, *attempts, *binding, *lists, *max_pending, *name, *purge_queue;
    PyObject *rule, *sink, *sync_types, *time_op, *timer;
    PyObject *sync_seen; /* the last class found in sync_types */
    double max_timeout;
    Py_ssize_t cancelled, completed;
    char closed;
} PurgatoryObject;

/* The purgatory's owned object fields (its lifecycle, purgatory.c). */
#define PURGATORY_FIELDS(X)                                                                     \
    X(attempt) X(attempts) X(binding) X(lists) X(max_pending) X(name) X(purge_queue) X(rule)    \
    X(sink) X(sync_types) X(time_op) X(timer) X(sync_seen)

/* An object field of a core type, as Python sees it (a getset): unset reads as an
 * AttributeError (or None, for the fields whose None is their NULL), and every assignment makes
 * the object check its fields again at the next C call. */
typedef struct {
    Py_ssize_t offset;
    const char *name;
    char none_if_null;
} FieldSpec;

#define FIELD_AT(o, spec) ((PyObject **)((char *)(o) + (spec)->offset))

static PyObject *
field_get(PyObject *self, void *closure)
{
    const FieldSpec *spec = closure;
    PyObject *value = *FIELD_AT(self, spec);
    if (value == NULL) {
        if (spec->none_if_null) {
            Py_RETURN_NONE;
        }
        PyErr_Format(PyExc_AttributeError, "'%.200s' object has no attribute '%s'",
                     Py_TYPE(self)->tp_name, spec->name);
        return NULL;
    }
    return Py_NewRef(value);
}

static int
field_set(PyObject *self, PyObject *value, void *closure)
{
    const FieldSpec *spec = closure;
    PyObject **slot = FIELD_AT(self, spec);
    if (value == NULL && *slot == NULL && !spec->none_if_null) {
        PyErr_SetString(PyExc_AttributeError, spec->name);
        return -1;
    }
    PyObject *old = *slot;
    *slot = (value == Py_None && spec->none_if_null) ? NULL : Py_XNewRef(value);
    Py_XDECREF(old);
    ((CoreObject *)self)->ready = 0;
    return 0;
}

#define FIELD(type, member, pyname)                                                             \
    {pyname, field_get, field_set, NULL,                                                        \
     (void *)&(const FieldSpec){offsetof(type, member), pyname, 0}}
#define FIELD_OR_NONE(type, member, pyname)                                                     \
    {pyname, field_get, field_set, NULL,                                                        \
     (void *)&(const FieldSpec){offsetof(type, member), pyname, 1}}

/* -- a type's lifecycle, generated from its field table ---------------------------------------- */

/* Every type of the module lists its owned object fields once, as an X-macro beside its struct:
 *
 *     #define RULE_FIELDS(X) X(lists) X(timer) X(idle_at)
 *
 * and TYPE_LIFECYCLE defines its traverse, clear and dealloc from that table, so that a field
 * added to the table is visited, cleared and released, and a field cannot be visited by one of
 * them and forgotten by another (a leak, or a cycle never broken). tests/test_native_module.py
 * checks each struct's `PyObject *` fields against its table, and that each field set from
 * Python is reported by `gc.get_referents`, broken out of a cycle and released.
 *
 *     TYPE_LIFECYCLE(prefix, Type, FIELDS, KEPT, WEAK, MORE)
 *
 * - FIELDS: the fields tp_clear clears (a collection breaks cycles through them);
 * - KEPT: fields traversed but kept until the dealloc (NO_FIELDS for none): what a C body may
 *   still need after a collection cleared the object (the NativeMethod's module);
 * - WEAK: HAS_WEAKREFS for a type with a `weakreflist` member (cleared first in the dealloc),
 *   else NO_WEAKREFS;
 * - MORE: the hand-written part, for what is not a plain owned field (a C array of objects: the
 *   threshold queue's ring and heap, the wheel's queue of buckets; a bucket's list of entries):
 *   `MORE##_visit(self, visit, arg)` (int), `MORE##_unready(self)` (void: the object's "set
 *   up" flag reset, a core's `ready`, an operation's `set` bits; run by tp_clear first, again
 *   before each field's release, since a release may run code that calls a method, which may
 *   check the fields again and find them whole if that code assigned them, and once more at its
 *   end), `MORE##_forget(self)` (void, run last by tp_clear, before that final reset) and
 *   `MORE##_free(self)` (void, run by the dealloc after tp_clear's work: C memory a cleared
 *   object still uses, the wheel's tick arrays), or NO_MORE, or READY_ONLY (a core whose only
 *   hand-written part is its `ready` reset).
 *
 * So a method called on an object a collection is clearing, or has cleared, takes the path of
 * an object not set up (the reference's, which finds the fields unset: an AttributeError, as
 * for a pure object whose slots the collection cleared) and never reads a NULL field as one the
 * check found set.
 *
 * The dealloc: untrack, weak references, tp_clear's work, the kept fields, MORE's free, tp_free,
 * the type (a heap type: its instances hold it). */
#define NO_FIELDS(X)
#define LIFE_VISIT_(member) Py_VISIT(o_->member);
#define LIFE_CLEAR_(member) Py_CLEAR(o_->member);
#define LIFE_CLEAR_UNREADY_(member)                                                             \
    unready_(self);                                                                             \
    Py_CLEAR(o_->member);
#define HAS_WEAKREFS(o)                                                                         \
    if ((o)->weakreflist != NULL) {                                                             \
        PyObject_ClearWeakRefs((PyObject *)(o));                                                \
    }
#define NO_WEAKREFS(o)

static inline int
NO_MORE_visit(PyObject *self, visitproc visit, void *arg)
{
    return 0;
}

static inline void
NO_MORE_unready(PyObject *self)
{
}

static inline void
NO_MORE_forget(PyObject *self)
{
}

static inline void
NO_MORE_free(PyObject *self)
{
}

/* The hand-written part of a core that has nothing but its `ready` (CORE_HEAD) to reset. */
#define READY_ONLY_visit NO_MORE_visit
#define READY_ONLY_forget NO_MORE_forget
#define READY_ONLY_free NO_MORE_free

static inline void
READY_ONLY_unready(PyObject *self)
{
    ((CoreObject *)self)->ready = 0;
}

#define TYPE_LIFECYCLE(prefix, Type, FIELDS, KEPT, WEAK, MORE)                                  \
    static int prefix##_traverse(PyObject *self, visitproc visit, void *arg)                    \
    {                                                                                           \
        Type *o_ = (Type *)self;                                                                \
        Py_VISIT(Py_TYPE(self));                                                                \
        FIELDS(LIFE_VISIT_)                                                                     \
        KEPT(LIFE_VISIT_)                                                                       \
        return MORE##_visit(self, visit, arg);                                                  \
    }                                                                                           \
    static int prefix##_clear(PyObject *self)                                                   \
    {                                                                                           \
        Type *o_ = (Type *)self;                                                                \
        void (*const unready_)(PyObject *) = MORE##_unready;                                    \
        (void)o_;                                                                               \
        unready_(self);                                                                         \
        FIELDS(LIFE_CLEAR_UNREADY_)                                                             \
        MORE##_forget(self);                                                                    \
        unready_(self);                                                                         \
        return 0;                                                                               \
    }                                                                                           \
    static void prefix##_dealloc(PyObject *self)                                                \
    {                                                                                           \
        Type *o_ = (Type *)self;                                                                \
        PyTypeObject *type = Py_TYPE(self);                                                     \
        (void)o_;                                                                               \
        PyObject_GC_UnTrack(self);                                                              \
        WEAK(o_)                                                                                \
        prefix##_clear(self);                                                                   \
        KEPT(LIFE_CLEAR_)                                                                       \
        MORE##_free(self);                                                                      \
        type->tp_free(self);                                                                    \
        Py_DECREF(type);                                                                        \
    }

/* The module's state (`NativeState`, at the end of this file) is reached through `st`: every
 * function that reads it has `NativeState *st` in scope, a parameter handed down from the entry
 * (a NativeMethod carries the state of the module that made it, so an entry costs no lookup).
 * `N.name`, the type names below, `Op_Check` and the other checks read it through `st`. */
#define N (*st)

/* The module's heap types, as the C reads them (`&OpType` is the state's type object). */
#define OpType (*N.op_type)
#define BucketType (*N.bucket_type)
#define WheelType (*N.wheel_type)
#define TimerType (*N.timer_type)
#define ThresholdType (*N.threshold_type)
#define ListsType (*N.lists_type)
#define RuleType (*N.rule_type)
#define PurgatoryType (*N.purgatory_type)
#define NativeMethodType (*N.native_method_type)

/* An instance of one of the core types: its own type, the native class over it (the
 * usual case, one comparison more), or anything deeper. */
#define CORE_CHECK(o, T)                                                                         \
    (Py_IS_TYPE((o), &(T)) || Py_TYPE(o)->tp_base == &(T) || PyType_IsSubtype(Py_TYPE(o), &(T)))

/* Operations come in a few classes, one at a time: the last class met is remembered in the
 * state (with a reference, so that its address cannot be reused by another). */
static int op_check_slow(NativeState *st, PyObject *o);

#define Op_Check(o) (Py_TYPE(o) == N.op_type_seen || op_check_slow(st, (o)))

/* -- attributes of the Python side's slotted objects, read as their slots ---------------------- */

/* The member (slot) an attribute name is on a class, while the class's version tag says it did
 * not change: reading it is then a load, not a lookup. For plain slotted classes only (no
 * instance dict, no __getattribute__ of their own); anything else is read as Python reads it. */
typedef struct {
    PyTypeObject *type; /* a strong reference: its address cannot be reused */
    unsigned int tag;
    PyMemberDef *member; /* NULL: read it as Python does */
} SlotCache;

static PyObject *
slot_cache_fill(PyObject *o, PyObject *name, SlotCache *cache)
{
    PyTypeObject *type = Py_TYPE(o);
    Py_CLEAR(cache->type);
    cache->member = NULL;
    cache->tag = 0;
    if (type->tp_getattro == PyObject_GenericGetAttr && type->tp_dictoffset == 0 &&
        !PyType_HasFeature(type, Py_TPFLAGS_MANAGED_DICT)) {
        PyObject *descr = PyObject_GetAttr((PyObject *)type, name);
        if (descr == NULL) {
            PyErr_Clear();
        }
        else {
            if (Py_IS_TYPE(descr, &PyMemberDescr_Type) && type->tp_version_tag != 0) {
                cache->member = ((PyMemberDescrObject *)descr)->d_member;
                cache->type = (PyTypeObject *)Py_NewRef((PyObject *)type);
                cache->tag = type->tp_version_tag;
            }
            Py_DECREF(descr);
        }
    }
    return PyObject_GetAttr(o, name);
}

/* `o.name` (a new reference), through `cache`. */
static inline PyObject *
get_slot(PyObject *o, PyObject *name, SlotCache *cache)
{
    PyTypeObject *type = Py_TYPE(o);
    if (type == cache->type && type->tp_version_tag == cache->tag) {
        return PyMember_GetOne((const char *)o, cache->member);
    }
    return slot_cache_fill(o, name, cache);
}

/* -- the user's methods, looked up once per class -------------------------------------------- */

#define M_TRY_COMPLETE 0
#define M_ON_COMPLETE 1
#define M_ON_EXPIRATION 2
#define M_COUNT 3

/* A class's three methods, while its version tag says the class (and its bases) did not change.
 * Only for classes whose instances have no __dict__ (an instance attribute could shadow a method)
 * and no __getattribute__ or __getattr__ of their own (it sees the lookups), and only methods
 * that are plain functions in a class's dict, not a staticmethod's: everything else is looked up
 * as Python does. */
typedef struct {
    PyTypeObject *type; /* a strong reference: its address cannot be reused */
    unsigned int tag;
    PyObject *methods[M_COUNT]; /* strong references, or NULL: look it up each time */
} MethodEntry;

#define METHOD_CACHE_SIZE 8

static PyObject *type_lookup_raw(PyTypeObject *type, PyObject *name); /* method.c */

/* The entry is cleared first and published last: the lookups may run a metaclass's code, which
 * may fill the same entry (a nested call) meanwhile. */
static void
method_entry_clear(MethodEntry *entry)
{
    PyObject *type = (PyObject *)entry->type;
    PyObject *methods[M_COUNT];
    for (int m = 0; m < M_COUNT; m++) {
        methods[m] = entry->methods[m];
        entry->methods[m] = NULL;
    }
    entry->type = NULL;
    entry->tag = 0;
    Py_XDECREF(type); /* (only once the entry is consistent: a decref may run code) */
    for (int m = 0; m < M_COUNT; m++) {
        Py_XDECREF(methods[m]);
    }
}

static MethodEntry *
method_entry_fill(PyTypeObject *type, MethodEntry *entry, PyObject *const *method_names)
{
    method_entry_clear(entry);
    if (type->tp_dictoffset != 0 || PyType_HasFeature(type, Py_TPFLAGS_MANAGED_DICT) ||
        type->tp_getattro != PyObject_GenericGetAttr) {
        return NULL;
    }
    PyObject *found[M_COUNT];
    for (int m = 0; m < M_COUNT; m++) {
        found[m] = type_lookup_raw(type, method_names[m]);
        if (found[m] == NULL) {
            PyErr_Clear();
        }
        else if (!PyFunction_Check(found[m])) {
            Py_CLEAR(found[m]);
        }
    }
    if (type->tp_version_tag == 0) {
        for (int m = 0; m < M_COUNT; m++) {
            Py_XDECREF(found[m]);
        }
        return NULL;
    }
    method_entry_clear(entry); /* (a nested fill may have published meanwhile) */
    for (int m = 0; m < M_COUNT; m++) {
        entry->methods[m] = found[m];
    }
    entry->type = (PyTypeObject *)Py_NewRef((PyObject *)type);
    entry->tag = type->tp_version_tag;
    return entry;
}

/* op.<method>(): the class's function called straight, or the method looked up as Python does. */
static inline PyObject *
op_method_call(MethodEntry *cache, PyObject *const *method_names, PyObject *op, int which)
{
    PyTypeObject *type = Py_TYPE(op);
    MethodEntry *entry = &cache[((uintptr_t)type >> 4) % METHOD_CACHE_SIZE];
    if (entry->type != type || entry->tag != type->tp_version_tag || entry->tag == 0) {
        entry = method_entry_fill(type, entry, method_names);
    }
    PyObject *function = entry == NULL ? NULL : entry->methods[which];
    if (function != NULL) {
        /* a function's own vectorcall, as the interpreter's call of it does; held, since the
         * call may change the class and so refill the cache entry */
        PyObject *args[2] = {NULL, op};
        Py_INCREF(function);
        PyObject *r = ((PyFunctionObject *)function)
                          ->vectorcall(function, args + 1, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        Py_DECREF(function);
        return r;
    }
    return PyObject_VectorcallMethod(method_names[which], &op,
                                     1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}
#define call_op_method(op, which) op_method_call(N.method_cache, N.method_names, (op), (which))
#define Bucket_Check(o) CORE_CHECK((o), BucketType)

/* -- what the module keeps: its types, interned names and the Python side's helpers ----------- */

struct NativeState {
    /* Every field before `bound` is an object the state holds, a strong reference (or NULL): the
     * module's traverse and clear walk them as one array (`NATIVE_OBJECT_COUNT`), so a field
     * added here is visited and cleared. */
    /* the module's heap types (PyType_FromModuleAndSpec) */
    PyTypeObject *op_type, *bucket_type, *wheel_type, *timer_type, *threshold_type,
        *lists_type, *rule_type, *purgatory_type, *native_method_type;
    /* names */
    PyObject *s_try_complete, *s_on_complete, *s_on_expiration, *s_settled, *s_completed,
        *s_cancelled, *s_expired, *s_done, *s_set_result, *s_loop, *s_thread, *s_check_thread,
        *s_bind, *s_wake_tick, *s_wake_by, *s_take, *s_watches, *s_ends, *s_limit, *s_eager, *s_pop,
        *s_join_plain, *s_join_at, *s_tidy, *s_fail, *s_wake_awaiters, *s_refuse,
        *s_ended_before_registration, *s_abandon, *s_request_pass, *s_purge_queue, *s_ended,
        *s_sort, *s_key, *s_discard, *s_threshold, *s_reached, *s_remove;
    PyObject *s_check_clock, *s_schedule, *s_ticks, *s_outcome, *s_now, *s_gone;
    PyObject *s_impl_module, *s_native; /* "purgatory._impl", "native" */
    PyObject *kw_key;             /* ("key",) */
    /* imported at the module's exec */
    PyObject *math_ceil;          /* math.ceil */
    PyObject *pop_sentinel;       /* what a pop returns for a key that is not there */
    PyObject *dict_pop_method;    /* dict.pop (dict_pop before 3.13) */
    /* the Python side's helpers, pulled from the package's modules at the first call of a C body
     * once they are all there (`native_pull_helpers`, native.c) */
    PyObject *report_exception;   /* report_exception(message, exc, **context) */
    PyObject *report_false_claim; /* (op, claimed) */
    PyObject *report_attempt;     /* _watchers._report_attempt(op, key, exc) */
    PyObject *release_lone;       /* _watchers._release_lone(op, key) */
    PyObject *threshold_of;       /* _thresholds.threshold_of(op, key) */
    PyObject *running_loop;       /* asyncio._get_running_loop */
    PyObject *expired_then_raise; /* _operation._expired_then_raise(op, interrupt) */
    PyObject *report_expiration;  /* _operation._report_expiration(op, exc) */
    PyObject *deadline_of;        /* _wheel._deadline_of */
    PyObject *nothing_to_pop;     /* _watchers._NOTHING_TO_POP */
    PyObject *split_keys;         /* _purgatory._split_keys(keys) */
    PyObject *check_one_threshold; /* _purgatory._check_one_threshold(threshold, marks) */
    PyObject *no_keys, *beyond_horizon, *full; /* _purgatory's error builders */
    /* the last operation class met (Op_Check) */
    PyTypeObject *op_type_seen;
    int bound; /* the helpers are there: the C bodies run (until then, the reference) */
    /* dict.pop's own C function (its descriptor's PyMethodDef, METH_FASTCALL), called without
     * the descriptor's checks; NULL: call the descriptor */
    PyObject *(*dict_pop_fast)(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
    PyObject *method_names[M_COUNT]; /* borrowed from the names above */
    /* the caches: strong references to the classes they describe (traversed, cleared) */
    MethodEntry method_cache[METHOD_CACHE_SIZE];
    SlotCache slot_loop, slot_thread, slot_wake_tick, slot_watches, slot_ends, slot_limit,
        slot_eager;
};

#define NATIVE_OBJECT_COUNT (offsetof(NativeState, bound) / sizeof(PyObject *))
#define NATIVE_OBJECTS(st) ((PyObject **)(st))

static struct PyModuleDef native_module; /* native.c */

/* The state of the module whose type `type` is or derives from, for a slot that runs outside a C
 * body and needs it (a setter: no NativeMethod hands it `st`, and `type` is the reference's
 * subclass or a user's); NULL with an exception set if none. */
static inline NativeState *
state_of_type(PyTypeObject *type)
{
    PyObject *module = PyType_GetModuleByDef(type, &native_module);
    return module == NULL ? NULL : PyModule_GetState(module);
}

static int
op_check_slow(NativeState *st, PyObject *o)
{
    PyTypeObject *type = Py_TYPE(o);
    if (!PyType_IsSubtype(type, &OpType)) {
        return 0;
    }
    Py_INCREF(type);
    Py_XSETREF(N.op_type_seen, type);
    return 1;
}

static inline PyObject *
none_if_null(PyObject *o)
{
    return o == NULL ? Py_None : o;
}

/* Replace *slot by `value` (a new reference is taken), releasing the old one. */
static inline void
set_field(PyObject **slot, PyObject *value)
{
    PyObject *old = *slot;
    Py_XINCREF(value);
    *slot = value;
    Py_XDECREF(old);
}

/* o.name() with the method looked up on its type (no bound method is built). */
static inline PyObject *
call_method0(PyObject *o, PyObject *name)
{
    return PyObject_VectorcallMethod(name, &o, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

static inline PyObject *
call_method1(PyObject *o, PyObject *name, PyObject *a)
{
    PyObject *args[2] = {o, a};
    return PyObject_VectorcallMethod(name, args, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

static inline PyObject *
call_method2(PyObject *o, PyObject *name, PyObject *a, PyObject *b)
{
    PyObject *args[3] = {o, a, b};
    return PyObject_VectorcallMethod(name, args, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

static inline PyObject *
call_method3(PyObject *o, PyObject *name, PyObject *a, PyObject *b, PyObject *c)
{
    PyObject *args[4] = {o, a, b, c};
    return PyObject_VectorcallMethod(name, args, 4 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

static inline PyObject *
call1(PyObject *f, PyObject *a)
{
    PyObject *args[2] = {NULL, a};
    return PyObject_Vectorcall(f, args + 1, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

static inline PyObject *
call2(PyObject *f, PyObject *a, PyObject *b)
{
    PyObject *args[3] = {NULL, a, b};
    return PyObject_Vectorcall(f, args + 1, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

static inline PyObject *
call3(PyObject *f, PyObject *a, PyObject *b, PyObject *c)
{
    PyObject *args[4] = {NULL, a, b, c};
    return PyObject_Vectorcall(f, args + 1, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

/* d.pop(key): 1 with *value (a new reference), 0 if `key` is not there, -1 on error. One lookup,
 * as d.pop does (a key's __eq__ runs once, and nothing of the user's runs between finding the
 * value and taking it out): PyDict_Pop from 3.13, the dict's own `pop` method before. */
static inline int
dict_pop_in(NativeState *st, PyObject *d, PyObject *key, PyObject **value)
{
#if PY_VERSION_HEX >= 0x030D0000
    (void)st;
    return PyDict_Pop(d, key, value);
#else
    PyObject *args[3] = {d, key, N.pop_sentinel};
    PyObject *v = N.dict_pop_fast != NULL ? N.dict_pop_fast(d, args + 1, 2)
                                          : PyObject_Vectorcall(N.dict_pop_method, args, 3, NULL);
    if (v == NULL) {
        *value = NULL;
        return -1;
    }
    if (v == N.pop_sentinel) {
        Py_DECREF(v);
        *value = NULL;
        return 0;
    }
    *value = v;
    return 1;
#endif
}
#define dict_pop(d, key, value) dict_pop_in(st, (d), (key), (value))

/* d.pop(key, None), the value dropped: 1 if it was there, 0 if not, -1 on error. */
static inline int
dict_discard_in(NativeState *st, PyObject *d, PyObject *key)
{
    PyObject *value;
    int found = dict_pop(d, key, &value);
    Py_XDECREF(value);
    return found;
}
#define dict_discard(d, key) dict_discard_in(st, (d), (key))

/* `a op b` (Py_LT or Py_LE) as Python compares: ints that fit and floats in C, the rest by
 * their own comparison. 1, 0, or -1 on error. */
static inline int
compare_values(PyObject *a, PyObject *b, int op)
{
    if (PyLong_CheckExact(a) && PyLong_CheckExact(b)) {
        int overflow_a, overflow_b;
        long long x = PyLong_AsLongLongAndOverflow(a, &overflow_a);
        long long y = PyLong_AsLongLongAndOverflow(b, &overflow_b);
        if (!overflow_a && !overflow_b && !(x == -1 && PyErr_Occurred()) &&
            !(y == -1 && PyErr_Occurred())) {
            return op == Py_LT ? x < y : x <= y;
        }
        PyErr_Clear();
    }
    else if (PyFloat_CheckExact(a) && PyFloat_CheckExact(b)) {
        double x = PyFloat_AS_DOUBLE(a), y = PyFloat_AS_DOUBLE(b);
        return op == Py_LT ? x < y : x <= y;
    }
    return PyObject_RichCompareBool(a, b, op);
}

/* Call and drop the result; -1 on error. */
static inline int
discard_result(PyObject *r)
{
    if (r == NULL) {
        return -1;
    }
    Py_DECREF(r);
    return 0;
}

/* queue.append(op), the purge-queue protocol (`purgatory._watchers`), for an operation still on a
 * list. The queue (an exact list) holds operations by identity: no __hash__ runs, nothing of the
 * user's (a list's growth is no GC allocation). 0, or -1 on error. */
static inline int
purge_queue_add(NativeState *st, PyObject *queue, OpObject *op)
{
    (void)st;
    if (queue != NULL && PyList_CheckExact(queue)) {
        return PyList_Append(queue, (PyObject *)op);
    }
    /* (a field Python code replaced: its `append`, as the reference calls it) */
    if (queue == NULL) {
        PyErr_SetString(PyExc_AttributeError, "_purge_queue");
        return -1;
    }
    Py_INCREF(queue);
    int err = discard_result(PyObject_CallMethod(queue, "append", "O", (PyObject *)op));
    Py_DECREF(queue);
    return err;
}

/* Whether an exception is an interrupt the reference lets through (KeyboardInterrupt or
 * SystemExit). */
static inline int
is_interrupt(PyObject *exc)
{
    return PyErr_GivenExceptionMatches(exc, PyExc_KeyboardInterrupt) ||
           PyErr_GivenExceptionMatches(exc, PyExc_SystemExit);
}

/* The currently raised exception, taken (3.11's three-value API behind one call). */
static inline PyObject *
fetch_exception(void)
{
#if PY_VERSION_HEX >= 0x030C0000
    return PyErr_GetRaisedException();
#else
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL && value != NULL) {
        PyException_SetTraceback(value, tb);
    }
    Py_XDECREF(type);
    Py_XDECREF(tb);
    return value;
#endif
}

static inline void
restore_exception(PyObject *exc)
{
#if PY_VERSION_HEX >= 0x030C0000
    PyErr_SetRaisedException(exc);
#else
    PyObject *tb = PyException_GetTraceback(exc);
    PyErr_Restore(Py_NewRef((PyObject *)Py_TYPE(exc)), exc, tb);
#endif
}

#endif
