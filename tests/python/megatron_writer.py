"""A Megatron-LM indexed dataset writer (the format of megatron/core/datasets/indexed_dataset.py's
_IndexWriter and IndexedDatasetBuilder, written here from its description): PREFIX.bin holds the
ids of every sequence back to back; PREFIX.idx = b"MMIDIDX\\x00\\x00", u64 version 1, u8 dtype code,
u64 sequence count, u64 document-index count, i32 sequence lengths, i64 byte pointers, i64
document indices (the sequence index each document starts at, then the sequence count)."""
import struct

import numpy as np

CODES = {np.uint8: 1, np.int8: 2, np.int16: 3, np.int32: 4, np.int64: 5, np.float64: 6, np.float32: 7, np.uint16: 8}


def write(prefix, documents, dtype):
    """documents: a list of documents, each a list of sequences, each a list of ids."""
    dtype = np.dtype(dtype).type
    lengths, pointers, doc_index = [], [], [0]
    offset = 0
    with open(prefix + ".bin", "wb") as b:
        for doc in documents:
            for seq in doc:
                a = np.asarray(seq, dtype=dtype)
                b.write(a.tobytes(order="C"))
                lengths.append(len(a))
                pointers.append(offset)
                offset += a.nbytes
            doc_index.append(len(lengths))
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", CODES[dtype]))
        f.write(struct.pack("<Q", len(lengths)))
        f.write(struct.pack("<Q", len(doc_index)))
        f.write(np.asarray(lengths, dtype=np.int32).tobytes(order="C"))
        f.write(np.asarray(pointers, dtype=np.int64).tobytes(order="C"))
        f.write(np.asarray(doc_index, dtype=np.int64).tobytes(order="C"))
