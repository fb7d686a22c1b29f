#!/usr/bin/env python3
"""Writes the seed corpus for frame_fuzz: well-formed frames (byte 0 = fd
control, see frame_fuzz.c) covering payloads, tensors, grads, names and
views. Run from tests/fuzz: ./gen_corpus.py"""
import struct, os

def pad(b): return b + b'\0' * (-len(b) % 8)

def header(flags, nfds, nst, natt, body, payload_len):
    return struct.pack('<IHHIIIIQQ', 0x4657504d, 1, flags, nfds, nst, natt, 0, len(body),
                       payload_len) + body

def storage_fd(ref, size): return struct.pack('<IIQ', 0, ref, size)

def tensor(storage, dtype, shape, strides, off=0, grad=False):
    return struct.pack('<IIIIQ', storage, dtype, len(shape), 1 if grad else 0, off) + \
        struct.pack('<%dq' % len(shape), *shape) + struct.pack('<%dq' % len(strides), *strides)

def attach(kind, name, body):
    nl = 0xffff if name is None else len(name)
    return struct.pack('<HHI', kind, nl, len(body)) + (pad(name) if name else b'') + pad(body)

seeds = {
    'payload_only': (0, header(0, 0, 0, 0, pad(b'hello world'), 11)),
    'empty': (0, header(0, 0, 0, 0, b'', 0)),
    'one_tensor': (5, header(0, 1, 1, 1, storage_fd(0, 4096) +
                             attach(1, b'w', tensor(0, 11, [4, 4], [4, 1])), 0)),
    'views': (5, header(0, 1, 1, 3, storage_fd(0, 4096) +
                        attach(1, b'a', tensor(0, 11, [8, 8], [8, 1])) +
                        attach(1, b'at', tensor(0, 11, [8, 8], [1, 8])) +
                        attach(1, None, tensor(0, 11, [4], [2], off=16)), 0)),
    'grad': (6, header(0, 2, 2, 1, storage_fd(0, 4096) + storage_fd(1, 4096) +
                       attach(1, b'p', tensor(0, 12, [16], [1], grad=True) +
                              tensor(1, 12, [16], [1])), 0)),
    'scalar_payload': (5, header(0, 1, 1, 1, storage_fd(0, 4096) + pad(b'xyz') +
                                 attach(1, b's', tensor(0, 4, [], [])), 3)),
    'closed_marker': (0, header(2, 0, 0, 0, b'', 0)),
    'spilled': (5, header(1, 1, 0, 0, b'', 0)[:48]),
}
def compact(dtype, shape, strides=None, off=0, name=b't', payload=b''):
    # pin_gen, pin_slot (written by the harness: byte 0 bit 4), dtype, ndim,
    # sender pid and fd, size, payload_len, name_len, flags, reserved
    flags = (1 if strides is not None else 0) | (2 if off else 0)
    nl = 0xffff if name is None else len(name)
    rec = struct.pack('<IHBBiiQIHBB', 0, 0, dtype, len(shape), 0, -1, 4096, len(payload), nl,
                      flags, 0)
    rec += struct.pack('<Q', off) if off else b''
    rec += struct.pack('<%dq' % len(shape), *shape)
    rec += struct.pack('<%dq' % len(strides), *strides) if strides is not None else b''
    return rec + (name or b'') + payload

seeds['compact_one_tensor'] = (24, compact(0, [4096], payload=b'abcd'))
seeds['compact_view'] = (24, compact(11, [8, 8], [1, 8], off=64, name=None))
seeds['compact_scalar'] = (24, compact(4, [], name=b'scalar', payload=b'xyz'))
os.makedirs('corpus', exist_ok=True)
for name, (ctl, frame) in seeds.items():
    with open(os.path.join('corpus', name), 'wb') as f:
        f.write(bytes([ctl]) + frame)
