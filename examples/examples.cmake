# The examples. Single-file examples are examples/<name>.c; hogwild and
# dataloader share examples/common/ (MNIST reading, the MLP, progress bars)
# through one small library. Examples use only the public header.
set(MPROC_EXAMPLES buffer_reuse cuda_share pool_map producer_consumer spawn_errors
    tensor_share)
set(MPROC_EXAMPLE_COMMON_SOURCES data.c idx.c mlp.c progress.c)
set(MPROC_HOGWILD_SOURCES main.c mpi_backend.c train.c worker.c)
set(MPROC_DATALOADER_SOURCES loader.c main.c)

foreach(name ${MPROC_EXAMPLES})
  add_executable(${name} ${CMAKE_CURRENT_LIST_DIR}/${name}.c)
  target_link_libraries(${name} PRIVATE mproc_static)
  mproc_use_flags(${name})
endforeach()

if(OPENBLAS_LIB AND CBLAS_INCLUDE_DIR AND ZLIB_FOUND)
  list(TRANSFORM MPROC_EXAMPLE_COMMON_SOURCES PREPEND ${CMAKE_CURRENT_LIST_DIR}/common/)
  list(TRANSFORM MPROC_HOGWILD_SOURCES PREPEND ${CMAKE_CURRENT_LIST_DIR}/hogwild/)
  list(TRANSFORM MPROC_DATALOADER_SOURCES PREPEND ${CMAKE_CURRENT_LIST_DIR}/dataloader/)
  add_library(mproc_example_common STATIC ${MPROC_EXAMPLE_COMMON_SOURCES})
  target_include_directories(mproc_example_common PUBLIC ${CMAKE_CURRENT_LIST_DIR}/common
                             ${CBLAS_INCLUDE_DIR})
  target_link_libraries(mproc_example_common PUBLIC mproc_static ${OPENBLAS_LIB} ZLIB::ZLIB m)
  mproc_use_flags(mproc_example_common)
  add_executable(hogwild ${MPROC_HOGWILD_SOURCES})
  add_executable(dataloader ${MPROC_DATALOADER_SOURCES})
  foreach(name hogwild dataloader)
    target_link_libraries(${name} PRIVATE mproc_example_common)
    mproc_use_flags(${name})
  endforeach()
else()
  message(STATUS "examples hogwild, dataloader: skipped (need libopenblas-dev and zlib1g-dev)")
endif()
