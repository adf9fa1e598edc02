#include "support/paths.hpp"
