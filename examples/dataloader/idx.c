/* The dataloader reuses the hogwild example's idx code as is: compiling it
 * here (the CMake glob builds every .c of this folder) keeps one copy of
 * the source without a library for two examples. */
#include "../hogwild/idx.c"
