// SPDX-License-Identifier: Apache-2.0
// Adaptive waiting's rule (common/adaptive_spin.hpp): the spin window grows
// after short sleeps, shrinks to nothing after long ones, and spin slots
// bound how many threads spin at once.
#include "rdmabroker/common/adaptive_spin.hpp"

#include <gtest/gtest.h>

namespace rdmabroker {
namespace {

using namespace std::chrono_literals;

TEST(AdaptiveSpin, AShortSleepGrowsTheWindowUpToTheBound) {
  AdaptiveSpin spin(200us);
  EXPECT_EQ(spin.window(), 0ns);  // nothing known yet: sleep at once
  spin.slept(80us);               // woken soon after: a spin would have caught it
  EXPECT_EQ(spin.window(), 50us);
  spin.slept(60us);
  EXPECT_EQ(spin.window(), 100us);
  spin.slept(150us);
  EXPECT_EQ(spin.window(), 200us);
  spin.slept(190us);
  EXPECT_EQ(spin.window(), 200us);  // never past the bound
}

TEST(AdaptiveSpin, ALongSleepShrinksItToNothing) {
  AdaptiveSpin spin(200us);
  for (int i = 0; i < 3; ++i) spin.slept(10us);
  ASSERT_EQ(spin.window(), 200us);
  spin.slept(5ms);  // idle: spinning would have been wasted
  EXPECT_EQ(spin.window(), 100us);
  spin.slept(5ms);
  EXPECT_EQ(spin.window(), 50us);
  spin.slept(5ms);
  EXPECT_EQ(spin.window(), 0ns);  // below the start value: no spin at all
  spin.slept(200ms);
  EXPECT_EQ(spin.window(), 0ns);
}

TEST(AdaptiveSpin, ALowerBoundCutsTheWindow) {
  AdaptiveSpin spin(2ms);
  for (int i = 0; i < 4; ++i) spin.slept(100us);
  ASSERT_EQ(spin.window(), 2ms);
  spin.set_bound(200us);  // a reload lowered busy_poll_us
  EXPECT_EQ(spin.window(), 200us);
  spin.slept(500us);  // longer than the new bound
  EXPECT_EQ(spin.window(), 100us);
}

TEST(AdaptiveSpin, RanOutSaysUntilWhenToSpinAndWokeMeasuresTheSleepFromThere) {
  AdaptiveSpin spin;
  const auto t0 = AdaptiveSpin::Clock::time_point{} + std::chrono::hours(1);
  EXPECT_EQ(spin.ran_out(t0, 0us), t0);  // no busy-poll setting: the default bound; no window yet
  EXPECT_EQ(spin.bound(), AdaptiveSpin::kDefaultBound);
  spin.woke(t0 + 80us);  // within the bound
  EXPECT_EQ(spin.ran_out(t0 + 1ms, 0us), t0 + 1ms + 50us);
  spin.woke(t0 + 1ms + 5ms);                           // far beyond it
  EXPECT_EQ(spin.ran_out(t0 + 10ms, 2ms), t0 + 10ms);  // halved below the start value: none
  EXPECT_EQ(spin.bound(), 2ms);
}

TEST(SpinSlots, NoMoreSpinnersThanSlots) {
  SpinSlots slots(2);
  EXPECT_TRUE(slots.try_take());
  EXPECT_TRUE(slots.try_take());
  EXPECT_FALSE(slots.try_take());  // sleeps at once instead
  slots.release();
  EXPECT_TRUE(slots.try_take());
  EXPECT_GE(SpinSlots::default_limit(), 1u);
}

}  // namespace
}  // namespace rdmabroker
