/* mproc — torch.multiprocessing for C. The umbrella header. */
#ifndef MPROC_H
#define MPROC_H

#include "mproc/error.h"
#include "mproc/tensor.h"
#include "mproc/msg.h"
#include "mproc/queue.h"
#include "mproc/process.h"
#include "mproc/sync.h"
#include "mproc/cuda.h"
#include "mproc/pool.h"
#include "mproc/wait.h"

#endif
