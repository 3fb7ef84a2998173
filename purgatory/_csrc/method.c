/* NativeMethod: a C body behind a Python reference function.
 *
 * `function(ref, key)` makes a NativeMethod that runs the C body registered as `key`
 * ("<class name>.<method name>") behind the pure-Python reference function `ref`; the package's
 * `_impl.twin` puts it in the native class it makes beside the reference's class, which it
 * never touches. Everything a user or a tool reads of it (the name, the qualified name, the docstring, the
 * signature, `help()`) is the reference function's, reached through `__wrapped__` as for a
 * decorated function; calls run the C body, and the reference itself whenever the C body says
 * the case is not its own (NOT_HANDLED). It is a method descriptor (Py_TPFLAGS_METHOD_DESCRIPTOR),
 * so `obj.method(...)` calls it without building a bound method.
 */

typedef struct {
    PyObject_HEAD
    native_fn fn;
    PyObject *ref;
    vectorcallfunc vectorcall;
    PyObject *module; /* the module that made it: its state outlives the method */
    NativeState *st;  /* the module's state, handed to the C body */
} NativeMethodObject;

/* Its owned object fields: the reference, cleared by a collection; the module, kept until the
 * dealloc (a method still called after a collection broke a cycle through it keeps a valid
 * state). */
#define NM_FIELDS(X) X(ref)
#define NM_KEPT(X) X(module)

static int native_pull_helpers(PyObject *module); /* native.c */

static PyObject *nm_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                               PyObject *kwnames);

/* The first calls, before the module's state has the reference's helpers: pull them, then run
 * the C body if they are there, the reference if not. Kept out of nm_vectorcall, whose path is
 * then a load and a test more than the C body's own. */
static Py_NO_INLINE PyObject *
nm_vectorcall_unbound(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    NativeMethodObject *m = (NativeMethodObject *)self;
    if (native_pull_helpers(m->module)) {
        return nm_vectorcall(self, args, nargsf, kwnames);
    }
    return PyObject_Vectorcall(m->ref, args, nargsf, kwnames);
}

static PyObject *
nm_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    NativeMethodObject *m = (NativeMethodObject *)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    NativeState *st = m->st;
    if (nargs >= 1) {
        if (!N.bound) {
            return nm_vectorcall_unbound(self, args, nargsf, kwnames);
        }
        PyObject *result = m->fn(st, args[0], args + 1, nargs - 1, kwnames);
        if (result != NOT_HANDLED) {
            return result;
        }
    }
    return PyObject_Vectorcall(m->ref, args, nargsf, kwnames);
}

static PyObject *
nm_descr_get(PyObject *self, PyObject *obj, PyObject *type)
{
    if (obj == NULL || obj == Py_None) {
        return Py_NewRef(self);
    }
    return PyMethod_New(self, obj);
}

/* The attributes read from the reference function: what names it and documents it. */
static const char *const nm_delegated[] = {
    "__doc__",      "__name__",     "__qualname__", "__module__",  "__wrapped__",
    "__signature__", "__annotations__", "__defaults__", "__kwdefaults__", "__dict__", NULL,
};

static PyObject *
nm_getattro(PyObject *self, PyObject *name)
{
    NativeMethodObject *m = (NativeMethodObject *)self;
    if (PyUnicode_Check(name)) {
        for (const char *const *d = nm_delegated; *d != NULL; d++) {
            if (PyUnicode_CompareWithASCIIString(name, *d) == 0) {
                if (strcmp(*d, "__wrapped__") == 0) {
                    return Py_NewRef(m->ref);
                }
                return PyObject_GetAttr(m->ref, name);
            }
        }
    }
    return PyObject_GenericGetAttr(self, name);
}

/* What names and documents a NativeMethod is its reference's: data descriptors, so that even a
 * lookup that bypasses __getattribute__ (pydoc's, for the docstring) finds the reference's. */
static PyObject *
nm_get_ref_attribute(PyObject *self, void *name)
{
    return PyObject_GetAttrString(((NativeMethodObject *)self)->ref, (const char *)name);
}

static PyObject *
nm_get_wrapped(PyObject *self, void *closure)
{
    return Py_NewRef(((NativeMethodObject *)self)->ref);
}

static PyGetSetDef nm_getset[] = {
    {"__doc__", nm_get_ref_attribute, NULL, NULL, "__doc__"},
    {"__name__", nm_get_ref_attribute, NULL, NULL, "__name__"},
    {"__qualname__", nm_get_ref_attribute, NULL, NULL, "__qualname__"},
    {"__module__", nm_get_ref_attribute, NULL, NULL, "__module__"},
    {"__wrapped__", nm_get_wrapped, NULL, NULL, NULL},
    {NULL},
};

static PyObject *
nm_repr(PyObject *self)
{
    NativeMethodObject *m = (NativeMethodObject *)self;
    PyObject *qualname = PyObject_GetAttrString(m->ref, "__qualname__");
    if (qualname == NULL) {
        return NULL;
    }
    PyObject *r = PyUnicode_FromFormat("<native function %U>", qualname);
    Py_DECREF(qualname);
    return r;
}

TYPE_LIFECYCLE(nm, NativeMethodObject, NM_FIELDS, NM_KEPT, NO_WEAKREFS, NO_MORE)

static PyMemberDef nm_members[] = {
    {"__vectorcalloffset__", Py_T_PYSSIZET, offsetof(NativeMethodObject, vectorcall), Py_READONLY},
    {NULL},
};

/* A method with a C body, documented by its pure-Python reference (__wrapped__). No Py_tp_doc:
 * a heap type's docstring would be put in its dict over the `__doc__` getset, and the instances
 * would show it instead of their reference's. */
static PyType_Slot nm_slots[] = {
    {Py_tp_call, PyVectorcall_Call},
    {Py_tp_descr_get, nm_descr_get},
    {Py_tp_getattro, nm_getattro},
    {Py_tp_getset, nm_getset},
    {Py_tp_members, nm_members},
    {Py_tp_repr, nm_repr},
    {Py_tp_traverse, nm_traverse},
    {Py_tp_clear, nm_clear},
    {Py_tp_dealloc, nm_dealloc},
    {0, NULL},
};

static PyType_Spec nm_spec = {
    .name = "purgatory._native.NativeMethod",
    .basicsize = sizeof(NativeMethodObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
             Py_TPFLAGS_METHOD_DESCRIPTOR | Py_TPFLAGS_IMMUTABLETYPE |
             Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = nm_slots,
};

/* A NativeMethod running `fn` (with `module`'s state) behind the reference `ref`. */
static PyObject *
native_method_new(PyObject *module, native_fn fn, PyObject *ref)
{
    NativeState *st = PyModule_GetState(module);
    NativeMethodObject *m = PyObject_GC_New(NativeMethodObject, &NativeMethodType);
    if (m == NULL) {
        return NULL;
    }
    m->fn = fn;
    m->ref = Py_NewRef(ref);
    m->vectorcall = nm_vectorcall;
    m->module = Py_NewRef(module);
    m->st = st;
    PyObject_GC_Track(m);
    return (PyObject *)m;
}

/* The registry of C bodies, by "<class name>.<method name>" (filled by the parts). */
typedef struct {
    const char *name;
    native_fn fn;
} NativeEntry;

/* What the class `type` holds under `name`, found along its MRO as attribute lookup finds it but
 * not bound nor unwrapped (a staticmethod is the staticmethod, not its function): a new reference,
 * or NULL with no exception set if no class of the MRO has it (or on an error, cleared: the
 * caller then looks the method up as Python does). */
static PyObject *
type_lookup_raw(PyTypeObject *type, PyObject *name)
{
    PyObject *mro = type->tp_mro;
    if (mro == NULL || !PyTuple_Check(mro)) {
        return NULL;
    }
    Py_INCREF(mro);
    PyObject *found = NULL;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(mro) && found == NULL; i++) {
        PyObject *base = PyTuple_GET_ITEM(mro, i);
        if (!PyType_Check(base)) {
            continue;
        }
#if PY_VERSION_HEX >= 0x030C0000
        PyObject *dict = PyType_GetDict((PyTypeObject *)base);
#else
        PyObject *dict = Py_XNewRef(((PyTypeObject *)base)->tp_dict);
#endif
        if (dict == NULL) {
            continue;
        }
        /* (the lookup may run a key's __eq__: the value is taken before anything else runs) */
        found = Py_XNewRef(PyDict_GetItemWithError(dict, name));
        Py_DECREF(dict);
        if (found == NULL && PyErr_Occurred()) {
            PyErr_Clear();
            break;
        }
    }
    Py_DECREF(mro);
    return found;
}
