/* The tap's one implementation unit, for build systems that compile the header as a module
 * (Swift / Objective-C through module.modulemap, SwiftPM, Xcode): add this file to the target. */
#define WORKBENCH_TAP_IMPLEMENTATION
#include "workbench_tap.h"
