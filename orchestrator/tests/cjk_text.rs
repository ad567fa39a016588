//! Chinese (CJK) text in the offline lexical judge and the local BM25 index, on eight
//! hand-written research topics: each has a rubric and a report in Chinese and the same in
//! English; every report says what its rubric asks in its own sentences and order (none is built
//! from its rubric's text), and each language's reports serve as the unrelated reports of the
//! other topics.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use orchestrator::domain::judge::lexical::{LexicalJudge, key_terms};
use orchestrator::domain::judge::{Judge, Origin, Rubric, ScoreMode, TraceView};
use orchestrator::domain::trajectory::Stage;
use orchestrator::infra::tools::local_search::{CorpusDoc, LocalIndex};

/// (zh title, zh description, zh report, en title, en description, en report)
const TOPICS: &[(&str, &str, &str, &str, &str, &str)] = &[
    (
        "人口老龄化对经济增长的影响",
        "指出劳动力供给减少和养老支出上升",
        "随着老龄化程度加深，劳动人口占比下降，企业招工越来越难；与此同时，政府在养老金和医疗上的支出持续上升，财政压力加大，经济增长因此放缓。",
        "Effect of population ageing on economic growth",
        "Points to a shrinking labour supply and rising pension spending",
        "As ageing deepens, the working-age share falls and firms struggle to hire; meanwhile government spending on pensions and health care keeps rising, straining public finances, so economic growth slows.",
    ),
    (
        "新能源汽车补贴退坡对市场的影响",
        "讨论补贴减少后的销量变化、车企的价格策略以及消费者的购买意愿",
        "2019年起国家逐步削减电动车购置补贴。补贴下调之后，部分车型销量一度下滑，比亚迪等车企通过降价和推出低配版本来应对；调查显示，消费者是否购买更多取决于续航和充电是否方便，而不是补贴金额。",
        "Impact of the phase-out of new energy vehicle subsidies on the market",
        "Discusses sales changes after subsidies are cut, automakers' pricing strategies and consumers' willingness to buy",
        "From 2019 the state gradually cut purchase subsidies for electric cars. After the subsidies were lowered, sales of some models fell for a while; BYD and other automakers responded with price cuts and cheaper trims; surveys show that whether consumers buy depends more on range and charging convenience than on the subsidy amount.",
    ),
    (
        "大语言模型在医疗诊断中的应用与风险",
        "说明模型辅助影像诊断的准确率、数据隐私问题以及医生的责任划分",
        "在放射科，已有医院用大模型辅助阅读CT影像，部分研究报告其诊断准确率接近资深医生。但患者数据用于训练时存在隐私泄露风险；一旦误诊，责任应由医生还是模型开发方承担，目前法律尚无定论。",
        "Applications and risks of large language models in medical diagnosis",
        "Explains the accuracy of model-assisted imaging diagnosis, data privacy issues and how liability is divided with doctors",
        "In radiology, some hospitals already use large models to help read CT images, and several studies report diagnostic accuracy close to senior doctors. But training on patient data carries a privacy risk, and when a misdiagnosis happens the law has not settled whether the doctor or the model developer is liable.",
    ),
    (
        "中国房地产市场下行的原因",
        "分析房企债务危机、居民购房需求下降和地方政府土地财政收入减少",
        "恒大、碧桂园等开发商相继出现债务违约，在建项目停工；年轻人对未来收入预期不稳，购房需求明显减弱；土地出让金收入随之下滑，地方政府财政紧张。",
        "Causes of the downturn in China's property market",
        "Analyses developers' debt crisis, falling household demand for homes and shrinking local government land revenue",
        "Developers such as Evergrande and Country Garden defaulted on debt one after another and construction sites stopped; young people, unsure about future income, show clearly weaker demand for buying homes; land sale revenue fell with it, leaving local government finances tight.",
    ),
    (
        "气候变化对全球粮食安全的威胁",
        "涉及极端天气导致的作物减产、粮食价格波动和贫困国家的饥饿问题",
        "近年来干旱、洪水等极端天气频发，小麦和玉米减产明显，国际粮价随之大幅波动；受冲击最大的是非洲和南亚的贫困国家，数百万人面临饥饿。",
        "Threats of climate change to global food security",
        "Covers crop yield losses from extreme weather, food price volatility and hunger in poor countries",
        "In recent years droughts, floods and other extreme weather have become frequent, wheat and maize harvests have fallen markedly, and international food prices have swung widely; poor countries in Africa and South Asia are hit hardest, with millions facing hunger.",
    ),
    (
        "半导体出口管制对中国芯片产业的影响",
        "讨论先进制程设备受限、国产替代进展以及企业研发投入的变化",
        "美国和荷兰限制向中国出口先进光刻机后，中芯国际等企业难以量产七纳米以下芯片。为此，国内加快了设备和材料的国产替代，华为等公司大幅增加研发投入。",
        "Impact of semiconductor export controls on China's chip industry",
        "Discusses restrictions on advanced process equipment, progress in domestic substitution and changes in company R&D spending",
        "After the US and the Netherlands restricted exports of advanced lithography machines to China, SMIC and others found it hard to mass-produce chips below seven nanometres. In response, domestic substitution of equipment and materials sped up, and companies such as Huawei sharply raised R&D spending.",
    ),
    (
        "远程办公对员工生产力的影响",
        "比较居家办公与办公室办公的效率差异，并指出沟通成本和工作生活界限的问题",
        "多项调查发现，员工在家工作时专注度更高、通勤时间省下来了，产出并不比在公司差；不过团队之间沟通变慢，开会次数增加，很多人也反映下班后仍要回消息，工作和生活难以分开。",
        "Effect of remote work on employee productivity",
        "Compares the efficiency of working from home with working in the office, and notes communication costs and blurred work-life boundaries",
        "Several surveys found that employees working from home focus better and save commuting time, and their output is no worse than in the office; but communication between teams slows down, meetings multiply, and many say they still answer messages after hours, so work and life are hard to separate.",
    ),
    (
        "短视频平台对青少年心理健康的影响",
        "涉及沉迷使用、睡眠不足、焦虑情绪以及平台的防沉迷措施",
        "不少中学生每天刷抖音超过三小时，晚上熬夜导致睡得太少；研究显示，长时间观看同龄人的精致生活容易让青少年产生焦虑和自卑。对此，平台推出了青少年模式，限制使用时长。",
        "Impact of short-video platforms on adolescent mental health",
        "Covers addictive use, lack of sleep, anxiety and platforms' anti-addiction measures",
        "Many secondary-school students spend over three hours a day on Douyin and stay up late, so they sleep too little; research shows that long hours watching peers' polished lives easily make teenagers anxious and insecure. In response, the platforms introduced a youth mode limiting usage time.",
    ),
];

fn rubric(title: &str, description: &str) -> Rubric {
    Rubric {
        id: uuid::Uuid::now_v7(),
        stage: Stage::Answer,
        title: title.into(),
        description: description.into(),
        weight: 1.0,
        negative: false,
        key_terms: vec![],
        origin: Origin::Dataset,
    }
}

async fn score(rubric: &Rubric, report: &str) -> u8 {
    let view = TraceView {
        stage_text: [
            String::new(),
            String::new(),
            String::new(),
            report.to_string(),
        ],
        answer: Some(report.to_string()),
        ..TraceView::default()
    };
    LexicalJudge::new("lexical")
        .score(
            "q",
            &view,
            std::slice::from_ref(rubric),
            ScoreMode::Stagewise,
        )
        .await
        .unwrap()
        .scores[0]
        .score
}

/// Before CJK runs were split, every Chinese rubric here scored 0 on its own report (its terms
/// were whole clauses). Now the Chinese mean is close to the English one, and no rubric scores
/// on another topic's report in either language.
#[tokio::test]
async fn chinese_and_english_reports_score_alike() {
    let n = TOPICS.len();
    let (mut zh_on, mut en_on) = (0u32, 0u32);
    let mut per_topic = Vec::new();
    for (i, &(zt, zd, zr, et, ed, er)) in TOPICS.iter().enumerate() {
        let (zh, en) = (rubric(zt, zd), rubric(et, ed));
        assert!(
            key_terms(&zh).iter().all(|k| k.chars().count() == 2),
            "{:?}",
            key_terms(&zh)
        );
        let (z, e) = (score(&zh, zr).await, score(&en, er).await);
        per_topic.push((z, e));
        zh_on += u32::from(z);
        en_on += u32::from(e);
        for (j, other) in TOPICS.iter().enumerate() {
            if j != i {
                assert_eq!(score(&zh, other.2).await, 0, "zh rubric {i} on report {j}");
                assert_eq!(score(&en, other.5).await, 0, "en rubric {i} on report {j}");
            }
        }
    }
    let (zh_mean, en_mean) = (zh_on as f64 / n as f64, en_on as f64 / n as f64);
    eprintln!("per topic (zh, en): {per_topic:?}; mean zh {zh_mean:.2}/2, en {en_mean:.2}/2");
    assert!(zh_mean > 0.0, "Chinese reports score again");
    assert!(
        (zh_mean - en_mean).abs() <= 0.25,
        "zh {zh_mean} en {en_mean}"
    );
}

/// A Chinese query (a rubric's title and description) finds the Chinese report that uses some of
/// its words, in another order, among the Chinese and English reports of all topics; English
/// queries find theirs.
#[test]
fn queries_find_their_reports_in_both_languages() {
    let mut docs = Vec::new();
    for (i, t) in TOPICS.iter().enumerate() {
        for (lang, text) in [("zh", t.2), ("en", t.5)] {
            docs.push(CorpusDoc {
                id: format!("{lang}-{i}"),
                title: String::new(),
                text: text.into(),
                url: None,
            });
        }
    }
    let idx = LocalIndex::build(&docs, None).unwrap();
    for (i, t) in TOPICS.iter().enumerate() {
        for (lang, query) in [("zh", [t.0, t.1]), ("en", [t.3, t.4])] {
            let query = query.join(" ");
            let hits = idx.search(&query, 3).unwrap();
            assert_eq!(
                hits.first().map(|h| h.id.as_str()),
                Some(format!("{lang}-{i}").as_str()),
                "{query}: {:?}",
                hits.iter().map(|h| (&h.id, h.score)).collect::<Vec<_>>()
            );
        }
    }
}
