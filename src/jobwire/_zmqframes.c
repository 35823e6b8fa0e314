/* Whole ZeroMQ messages in one call: receive a ROUTER message (identity and frames) as
 * Python bytes, send one from bytes, on a socket that pyzmq created and owns.
 *
 * Why hand-written: pyzmq (like every Python binding of libzmq we know) moves one frame per
 * call, and each call builds a Python object per frame, releases and retakes the GIL, and
 * checks the socket's state; a Majordomo request crosses the broker in about 20 frames, and
 * that per-frame work was the largest cost left per request (bench/PERFORMANCE.md, ZeroMQ
 * rounds 2 and 3). No library offers whole-message receive and send without those objects.
 *
 * The calls go to the libzmq that pyzmq loaded (its wheel bundles a private copy, and a
 * socket cannot be used through a second copy of the library): `bind(path)` takes the file
 * of pyzmq's compiled backend, which must already be loaded, and looks the functions up in
 * it and its dependencies. So the build needs neither pyzmq's nor libzmq's headers; the few
 * declarations below follow libzmq's stable ABI (zmq_msg_t is 64 opaque bytes since 4.0).
 *
 * Calls never block (ZMQ_DONTWAIT), so the GIL is kept: releasing it would cost more than
 * the call. Errors come back as OSError(errno, libzmq's message); a receive that finds no
 * message returns None without any exception.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dlfcn.h>
#include <errno.h>
#include <stddef.h>
#include <string.h>

#define ZMQ_DONTWAIT 1
#define ZMQ_SNDMORE 2

typedef struct {
    _Alignas(void *) unsigned char opaque[64];
} zmq_msg;

typedef struct {
    int (*msg_init)(zmq_msg *);
    int (*msg_recv)(zmq_msg *, void *, int);
    void *(*msg_data)(zmq_msg *);
    size_t (*msg_size)(const zmq_msg *);
    int (*msg_more)(const zmq_msg *);
    int (*msg_close)(zmq_msg *);
    int (*send)(void *, const void *, size_t, int);
    int (*errno_)(void);
    const char *(*strerror)(int);
    void (*version)(int *, int *, int *);
} zmq_api;

static zmq_api zmq;

static int bound = 0;

static PyObject *zmq_error(int code) {
    PyObject *args = Py_BuildValue("(is)", code, zmq.strerror(code));
    if (args != NULL) {
        PyErr_SetObject(PyExc_OSError, args);
        Py_DECREF(args);
    }
    return NULL;
}

static void *socket_of(PyObject *handle) {
    if (!bound) {
        PyErr_SetString(PyExc_RuntimeError, "_zmqframes: bind() was not called");
        return NULL;
    }
    void *sock = PyLong_AsVoidPtr(handle);
    if (sock == NULL && !PyErr_Occurred())
        PyErr_SetString(PyExc_ValueError, "_zmqframes: a null socket");
    return sock;
}

PyDoc_STRVAR(bind_doc,
             "bind(path) -> (major, minor, patch)\n\n"
             "Use the libzmq that the already loaded shared object at `path` (pyzmq's\n"
             "backend) links; OSError if it is not loaded or lacks a function.");

static PyObject *bind(PyObject *module, PyObject *arg) {
    (void)module;
    PyObject *encoded = NULL;
    if (!PyUnicode_FSConverter(arg, &encoded))
        return NULL;
    /* RTLD_NOLOAD: only a library this process already has, never a second copy. */
    void *lib = dlopen(PyBytes_AS_STRING(encoded), RTLD_NOW | RTLD_NOLOAD);
    Py_DECREF(encoded);
    if (lib == NULL) {
        const char *why = dlerror();
        PyErr_Format(PyExc_OSError, "_zmqframes: not loaded: %s", why ? why : "?");
        return NULL;
    }
    /* Looked up whole before use: a failed bind leaves an earlier one as it was. */
    zmq_api found;
    struct {
        const char *name;
        void **slot;
    } wanted[] = {
        {"zmq_msg_init", (void **)&found.msg_init},
        {"zmq_msg_recv", (void **)&found.msg_recv},
        {"zmq_msg_data", (void **)&found.msg_data},
        {"zmq_msg_size", (void **)&found.msg_size},
        {"zmq_msg_more", (void **)&found.msg_more},
        {"zmq_msg_close", (void **)&found.msg_close},
        {"zmq_send", (void **)&found.send},
        {"zmq_errno", (void **)&found.errno_},
        {"zmq_strerror", (void **)&found.strerror},
        {"zmq_version", (void **)&found.version},
    };
    for (size_t i = 0; i < sizeof wanted / sizeof wanted[0]; i++) {
        *wanted[i].slot = dlsym(lib, wanted[i].name);
        if (*wanted[i].slot == NULL) {
            PyErr_Format(PyExc_OSError, "_zmqframes: %s not found", wanted[i].name);
            dlclose(lib);
            return NULL;
        }
    }
    int major = 0, minor = 0, patch = 0;
    found.version(&major, &minor, &patch);
    if (major != 4) {
        PyErr_Format(PyExc_OSError, "_zmqframes: libzmq %d.%d.%d, not 4.x", major, minor, patch);
        dlclose(lib);
        return NULL;
    }
    /* The handle stays open (the functions must stay loaded); binding again only adds a
     * reference to a library that pyzmq keeps loaded anyway. */
    zmq = found;
    bound = 1;
    return Py_BuildValue("(iii)", major, minor, patch);
}

/* zmq_msg_recv, again when a signal interrupts it (libzmq's EINTR comes before it takes a
 * frame, and giving up between two frames of a message would split it). */
static int recv_frame(zmq_msg *msg, void *sock) {
    int got;
    do {
        got = zmq.msg_recv(msg, sock, ZMQ_DONTWAIT);
    } while (got < 0 && zmq.errno_() == EINTR);
    return got;
}

/* Receives the rest of a message whose frames can no longer be kept, so that the next
 * receive starts at a message boundary. */
static void discard_rest(void *sock, zmq_msg *msg) {
    while (zmq.msg_more(msg)) {
        zmq.msg_close(msg);
        zmq.msg_init(msg);
        if (recv_frame(msg, sock) < 0)
            break;
    }
    zmq.msg_close(msg);
}

PyDoc_STRVAR(recv_message_doc,
             "recv_message(socket) -> (identity, frames) or None\n\n"
             "One whole message from a ROUTER socket (its `underlying` address) without\n"
             "waiting; None when none is waiting. Raises OSError on a socket error.");

static PyObject *recv_message(PyObject *module, PyObject *handle) {
    (void)module;
    void *sock = socket_of(handle);
    if (sock == NULL)
        return NULL;
    zmq_msg msg;
    zmq.msg_init(&msg);
    if (recv_frame(&msg, sock) < 0) {
        int code = zmq.errno_();
        zmq.msg_close(&msg);
        if (code == EAGAIN)
            Py_RETURN_NONE;
        return zmq_error(code);
    }
    PyObject *identity = PyBytes_FromStringAndSize(zmq.msg_data(&msg), zmq.msg_size(&msg));
    PyObject *frames = PyList_New(0);
    if (identity == NULL || frames == NULL)
        goto fail;
    while (zmq.msg_more(&msg)) {
        zmq.msg_close(&msg);
        zmq.msg_init(&msg);
        if (recv_frame(&msg, sock) < 0) {
            /* Not expected: libzmq delivers a message's frames together (ETERM only). */
            int code = zmq.errno_();
            zmq.msg_close(&msg);
            Py_DECREF(identity);
            Py_DECREF(frames);
            return zmq_error(code);
        }
        PyObject *frame = PyBytes_FromStringAndSize(zmq.msg_data(&msg), zmq.msg_size(&msg));
        if (frame == NULL)
            goto fail;
        int appended = PyList_Append(frames, frame);
        Py_DECREF(frame);
        if (appended < 0)
            goto fail;
    }
    zmq.msg_close(&msg);
    PyObject *result = PyTuple_New(2);
    if (result == NULL) {
        Py_DECREF(identity);
        Py_DECREF(frames);
        return NULL;
    }
    PyTuple_SET_ITEM(result, 0, identity);
    PyTuple_SET_ITEM(result, 1, frames);
    return result;

fail: /* out of memory: the message is dropped whole */
    Py_XDECREF(identity);
    Py_XDECREF(frames);
    discard_rest(sock, &msg);
    return NULL;
}

/* Sending is all or nothing as far as this side can make it. A multi-part message that
 * stopped halfway would leave the socket expecting the rest, and the next message's frames
 * would be taken for it. So every frame is checked (and a buffer taken for any that is not
 * bytes) before the first goes out; a send interrupted by a signal (EINTR: libzmq returns it
 * before the frame is queued) is retried. What libzmq does on its side, for a ROUTER without
 * ZMQ_ROUTER_MANDATORY (jobwire never sets it): the first frame picks the peer's pipe; if
 * the peer is unknown, or its pipe is at the high-water mark, the whole message is dropped
 * there and every frame's send still succeeds (no EAGAIN, no half message); the mark counts
 * whole messages, so a message that started goes in whole, and one whose pipe closes
 * meanwhile is rolled back whole. The one error left halfway is ETERM (the context is
 * ending: the socket is finished anyway). */

/* One frame's bytes, for frames that are not bytes objects. */
typedef struct {
    Py_buffer view;
    int held;
} frame_view;

static int send_bytes(void *sock, const void *data, size_t size, int flags) {
    int sent;
    do {
        sent = zmq.send(sock, data, size, flags);
    } while (sent < 0 && zmq.errno_() == EINTR);
    if (sent < 0) {
        zmq_error(zmq.errno_());
        return -1;
    }
    return 0;
}

static int send_frame(void *sock, PyObject *frame, frame_view *view, int flags) {
    if (view != NULL && view->held)
        return send_bytes(sock, view->view.buf, (size_t)view->view.len, flags);
    return send_bytes(sock, PyBytes_AS_STRING(frame), (size_t)PyBytes_GET_SIZE(frame), flags);
}

static void release_views(frame_view *views, Py_ssize_t count) {
    for (Py_ssize_t i = 0; i < count; i++)
        if (views[i].held)
            PyBuffer_Release(&views[i].view);
    PyMem_Free(views);
}

/* Buffers for every frame that is not bytes (views[0] the identity, views[i + 1] frame i),
 * or NULL with TypeError, nothing held, if one is not bytes-like. */
static frame_view *take_views(PyObject *identity, PyObject **items, Py_ssize_t count) {
    frame_view *views = PyMem_Calloc((size_t)count + 1, sizeof *views);
    if (views == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = -1; i < count; i++) {
        PyObject *frame = i < 0 ? identity : items[i];
        if (PyBytes_CheckExact(frame))
            continue;
        if (!PyObject_CheckBuffer(frame) ||
            PyObject_GetBuffer(frame, &views[i + 1].view, PyBUF_SIMPLE) < 0) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError,
                         "send_message: a frame must be a contiguous bytes-like object, not %s",
                         Py_TYPE(frame)->tp_name);
            release_views(views, i + 1);
            return NULL;
        }
        views[i + 1].held = 1;
    }
    return views;
}

PyDoc_STRVAR(send_message_doc,
             "send_message(socket, identity, frames) -> None\n\n"
             "Send identity and frames (bytes-like) as one message on a ROUTER socket without\n"
             "waiting. TypeError before anything is sent if a frame is not bytes-like;\n"
             "OSError on a socket error. A message to an unknown peer, or to one whose queue is\n"
             "full, is dropped whole without an error (ROUTER's rule).");

static PyObject *send_message(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "send_message(socket, identity, frames)");
        return NULL;
    }
    void *sock = socket_of(args[0]);
    if (sock == NULL)
        return NULL;
    PyObject *frames = PySequence_Fast(args[2], "send_message: frames must be a sequence");
    if (frames == NULL)
        return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(frames);
    PyObject **items = PySequence_Fast_ITEMS(frames);
    int all_bytes = PyBytes_CheckExact(args[1]);
    for (Py_ssize_t i = 0; i < count; i++)
        all_bytes &= PyBytes_CheckExact(items[i]);
    frame_view *views = NULL;
    if (!all_bytes) {
        views = take_views(args[1], items, count);
        if (views == NULL) {
            Py_DECREF(frames);
            return NULL;
        }
    }
    /* From here on no Python code runs (bytes and held buffers only), so the list cannot
     * change under the loop. */
    int failed = send_frame(sock, args[1], views, count ? ZMQ_SNDMORE | ZMQ_DONTWAIT : ZMQ_DONTWAIT);
    for (Py_ssize_t i = 0; i < count && !failed; i++)
        failed = send_frame(sock, items[i], views ? &views[i + 1] : NULL,
                            i + 1 < count ? ZMQ_SNDMORE | ZMQ_DONTWAIT : ZMQ_DONTWAIT);
    if (views != NULL)
        release_views(views, count + 1);
    Py_DECREF(frames);
    if (failed)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_O, bind_doc},
    {"recv_message", recv_message, METH_O, recv_message_doc},
    {"send_message", (PyCFunction)(void (*)(void))send_message, METH_FASTCALL, send_message_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "jobwire._zmqframes",
    .m_doc = "Whole ZeroMQ messages per call on pyzmq's sockets (see the C source's comment).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__zmqframes(void) { return PyModule_Create(&module); }
